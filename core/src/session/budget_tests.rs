//! Budgets: requests start only under the budget; enqueue is refused once it is spent.

use super::*;
use crate::wire::{Budget, ContentBlock, Usage};

fn header() -> Header {
    Header {
        system_prompt: "s".into(),
        provider: "fake".into(),
        model: "m".into(),
        reasoning: None,
    }
}

/// A reply that used `tokens` (input) and cost `usd`, calling a tool when `tool`.
fn reply(tokens: u64, usd: Option<f64>, tool: bool) -> AssistantMessage {
    let mut content = vec![ContentBlock::Text { text: "ok".into() }];
    if tool {
        content.push(ContentBlock::ToolCall(ToolCall {
            id: "c1".into(),
            name: "list_sessions".into(),
            arguments: serde_json::json!({}),
        }));
    }
    AssistantMessage {
        content,
        usage: Some(Usage {
            input_tokens: tokens,
            output_tokens: 0,
            cost_usd: usd,
            ..Usage::default()
        }),
        ..Default::default()
    }
}

fn drain(session: &mut Session) -> Vec<Effect> {
    std::iter::from_fn(|| session.poll_effect()).collect()
}

fn budget_notices(effects: &[Effect]) -> usize {
    effects
        .iter()
        .filter(|e| matches!(e, Effect::AppendEntry(Entry { payload: EntryPayload::Custom { custom_type, .. }, .. }) if custom_type == custom_types::BUDGET_EXCEEDED))
        .count()
}

fn enqueue(session: &mut Session, i: u32) -> Result<(), EnqueueError> {
    session.handle_enqueue(
        Millis(1),
        format!("q{i}"),
        Lane::FollowUp,
        "ana".into(),
        "hi".into(),
    )
}

#[test]
fn requests_start_only_under_the_budget() {
    // (budget, replies' (tokens, usd), enqueues accepted before the refusal)
    let tokens = |n| Budget {
        max_tokens: Some(n),
        max_usd: None,
    };
    let usd = |n| Budget {
        max_tokens: None,
        max_usd: Some(n),
    };
    let cases: Vec<(Budget, (u64, Option<f64>), u32)> = vec![
        (tokens(100), (40, None), 3), // 40, 80, 120: the third overshoots by one request
        (tokens(100), (50, None), 2), // 50, 100: at the limit
        (tokens(1), (0, None), 10),   // nothing used: never refused (10 tried)
        (usd(0.01), (1, Some(0.004)), 3),
        (usd(0.01), (1, None), 10), // unpriced: costs nothing here
        (Budget::default(), (1000, Some(9.0)), 10),
    ];
    for (budget, (used, cost), accepted) in cases {
        let label = format!("{budget:?} spending {used} / {cost:?}");
        let mut session = Session::create(Millis(0), 1, header(), vec![]);
        session.handle_budget(Millis(0), budget, "ana");
        let mut ok = 0;
        for i in 0..10 {
            match enqueue(&mut session, i) {
                Ok(()) => {
                    ok += 1;
                    let step = session.checkpoint().step;
                    session.handle_inference_done(Millis(2), step, Ok(reply(used, cost, false)));
                }
                Err(EnqueueError::BudgetExceeded { limit }) => {
                    assert_eq!(
                        limit,
                        if budget.max_tokens.is_some() {
                            "tokens"
                        } else {
                            "usd"
                        }
                    );
                    break;
                }
                Err(e) => panic!("{label}: {e}"),
            }
            drain(&mut session);
        }
        assert_eq!(ok, accepted, "{label}");
        // Raising the budget lets the session continue.
        if ok < 10 {
            session.handle_budget(Millis(3), Budget::default(), "ana");
            assert!(enqueue(&mut session, 99).is_ok(), "{label}: not resumed");
        }
    }
}

#[test]
fn a_turn_that_reaches_the_budget_ends_before_its_next_request() {
    let mut session = Session::create(Millis(0), 1, header(), vec![]);
    session.handle_budget(
        Millis(0),
        Budget {
            max_tokens: Some(100),
            max_usd: None,
        },
        "ana",
    );
    enqueue(&mut session, 0).unwrap();
    drain(&mut session);
    // The first step spends the budget and calls a tool.
    session.handle_inference_done(Millis(2), 1, Ok(reply(150, None, true)));
    let effects = drain(&mut session);
    assert!(effects.iter().any(|e| matches!(e, Effect::RunTools { .. })));
    session.handle_tool_done(Millis(3), 1, "c1", "ok".into(), false);
    let effects = drain(&mut session);
    assert_eq!(budget_notices(&effects), 1, "{effects:?}");
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Infer { .. })),
        "{effects:?}"
    );
    assert!(effects.contains(&Effect::Idle));
    assert_eq!(session.status(), Status::Idle);
    assert_eq!(session.spent().tokens, 150);
}

#[test]
fn a_spent_tenant_budget_ends_the_turn_before_its_request() {
    let spent = crate::wire::Spent {
        tokens: 12,
        usd: 0.0,
    };
    let budget = Budget {
        max_tokens: Some(10),
        max_usd: None,
    };
    // (step the host refuses, ended)
    for (refused, ended) in [(1, true), (2, false), (0, false)] {
        let mut session = Session::create(Millis(0), 1, header(), vec![]);
        session
            .handle_enqueue(
                Millis(1),
                "q".into(),
                Lane::FollowUp,
                "ana".into(),
                "hi".into(),
            )
            .unwrap();
        let _ = drain(&mut session);
        assert!(matches!(
            session.checkpoint().phase,
            Phase::Inference { step: 1, .. }
        ));
        let got =
            session.handle_tenant_budget_exceeded(Millis(2), refused, "tokens", spent, budget);
        assert_eq!(got, ended, "step {refused}");
        let effects = drain(&mut session);
        assert_eq!(
            budget_notices(&effects),
            usize::from(ended),
            "step {refused}"
        );
        assert_eq!(session.status() == Status::Idle, ended, "step {refused}");
        if ended {
            // Later input starts a new turn as usual.
            session
                .handle_enqueue(
                    Millis(3),
                    "r".into(),
                    Lane::FollowUp,
                    "ana".into(),
                    "go".into(),
                )
                .unwrap();
            assert!(
                drain(&mut session)
                    .iter()
                    .any(|e| matches!(e, Effect::Infer { step: 2 }))
            );
        }
    }
}

#[test]
fn what_the_children_spent_counts_against_the_budget() {
    // (budget tokens, own reply tokens, children's reported tokens, whether enqueue is refused)
    let cases = [
        (100, 40, 0, false),
        (100, 40, 59, false),
        (100, 40, 60, true), // 40 + 60 reaches the limit
        (100, 0, 500, true),
    ];
    for (max, own, children, refused) in cases {
        let label = format!("budget {max}, own {own}, children {children}");
        let mut session = Session::create(Millis(0), 1, header(), vec![]);
        session.handle_budget(
            Millis(0),
            Budget {
                max_tokens: Some(max),
                max_usd: None,
            },
            "ana",
        );
        enqueue(&mut session, 0).unwrap();
        session.handle_inference_done(Millis(2), 1, Ok(reply(own, None, false)));
        drain(&mut session);
        session.handle_children_spent(crate::wire::Spent {
            tokens: children,
            usd: 0.0,
        });
        assert_eq!(session.total_spent().tokens, own + children, "{label}");
        assert_eq!(
            session.spent().tokens,
            own,
            "{label}: own spending stays its own"
        );
        let answer = enqueue(&mut session, 1);
        assert_eq!(
            matches!(answer, Err(EnqueueError::BudgetExceeded { .. })),
            refused,
            "{label}: {answer:?}"
        );
    }
}

#[test]
fn a_step_on_an_unpriced_model_under_a_usd_limit_ends_its_turn_before_its_request() {
    let refused = crate::llm::choice::check_priced(
        &crate::llm::models::ModelTable::builtin(),
        "openai",
        "o3",
        crate::llm::choice::UsdLimits {
            tenant: true,
            ..Default::default()
        },
    )
    .unwrap_err();
    let unpriced_notices = |effects: &[Effect]| {
        effects
            .iter()
            .filter_map(|e| match e {
                Effect::AppendEntry(Entry {
                    payload: EntryPayload::Custom { custom_type, data },
                    ..
                }) if custom_type == custom_types::UNPRICED_MODEL => Some(data.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    // (step the host refuses, ended)
    for (step, ended) in [(1, true), (2, false), (0, false)] {
        let mut session = Session::create(Millis(0), 1, header(), vec![]);
        enqueue(&mut session, 0).unwrap();
        let _ = drain(&mut session);
        assert_eq!(
            session.handle_unpriced_model(Millis(2), step, &refused),
            ended,
            "step {step}"
        );
        let notices = unpriced_notices(&drain(&mut session));
        assert_eq!(notices.len(), usize::from(ended), "step {step}");
        assert_eq!(session.status() == Status::Idle, ended, "step {step}");
        if ended {
            assert_eq!(notices[0]["model"], "o3");
            let text = notices[0]["text"].as_str().unwrap();
            assert!(text.contains("config/models.json"), "{text}");
            // The refused step spent nothing, and later input starts a new turn.
            assert_eq!(session.spent(), crate::wire::Spent::default());
            enqueue(&mut session, 1).unwrap();
            assert!(
                drain(&mut session)
                    .iter()
                    .any(|e| matches!(e, Effect::Infer { step: 2 }))
            );
        }
    }
}
