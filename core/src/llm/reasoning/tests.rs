use super::*;

/// What `plan` makes of a setting (as JSON) for a provider and model, with an optional tenant
/// table: the plan, or the refusal.
fn describe(tenant: Option<&str>, provider: &str, model: &str, reasoning: &str) -> String {
    let table = ModelTable::with_tenant(tenant).expect("a valid table");
    let reasoning: Reasoning = match serde_json::from_str(reasoning) {
        Ok(reasoning) => reasoning,
        Err(e) => return format!("json: {e}"),
    };
    match plan(&table, provider, model, &reasoning) {
        Ok(Plan::Thinking {
            budget_tokens,
            max_tokens,
        }) => format!("thinking {budget_tokens}/{max_tokens}"),
        Ok(Plan::Effort(effort)) => format!("effort {}", effort.as_str()),
        Err(e) => format!("400: {e}"),
    }
}

#[test]
fn settings_are_planned_or_refused_per_model() {
    let tenant = r#"{"models":[
        {"id":"my-claude","provider":"anthropic","reasoning":true},
        {"id":"tiny-claude","provider":"anthropic","reasoning":true,"maxOutputTokens":2047},
        {"id":"small-claude","provider":"anthropic","reasoning":true,"maxOutputTokens":2048},
        {"id":"gpt-4o","reasoning":true},
        {"id":"gpt-5-nano","reasoning":false}
    ]}"#;
    let cases: &[(Option<&str>, &str, &str, &str, &str)] = &[
        // Anthropic: an effort picks a budget, max_tokens leaves ANSWER_TOKENS for the answer.
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"low"}"#,
            "thinking 4096/12288",
        ),
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"medium"}"#,
            "thinking 12288/20480",
        ),
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"high"}"#,
            "thinking 24576/32768",
        ),
        (
            None,
            "anthropic",
            "claude-sonnet-4-5-20250929",
            r#"{"effort":"low"}"#,
            "thinking 4096/12288",
        ),
        // A model with a 32,000-token limit: max_tokens stops at the limit.
        (
            None,
            "anthropic",
            "claude-opus-4-1",
            r#"{"effort":"high"}"#,
            "thinking 24576/32000",
        ),
        // An explicit budget, at each bound.
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"low","budgetTokens":1024}"#,
            "thinking 1024/9216",
        ),
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"low","budgetTokens":1023}"#,
            r#"400: budgetTokens must be 1024 to 62976 for model "claude-sonnet-4-5" (its output limit less 1024 tokens for the answer); got 1023"#,
        ),
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"high","budgetTokens":62976}"#,
            "thinking 62976/64000",
        ),
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"high","budgetTokens":62977}"#,
            r#"400: budgetTokens must be 1024 to 62976 for model "claude-sonnet-4-5" (its output limit less 1024 tokens for the answer); got 62977"#,
        ),
        (
            None,
            "anthropic",
            "claude-opus-4-1",
            r#"{"effort":"high","budgetTokens":30976}"#,
            "thinking 30976/32000",
        ),
        (
            None,
            "anthropic",
            "claude-opus-4-1",
            r#"{"effort":"high","budgetTokens":30977}"#,
            r#"400: budgetTokens must be 1024 to 30976 for model "claude-opus-4-1" (its output limit less 1024 tokens for the answer); got 30977"#,
        ),
        (
            None,
            "anthropic",
            "claude-opus-4-1",
            r#"{"effort":"high","budgetTokens":4294967295}"#,
            r#"400: budgetTokens must be 1024 to 30976 for model "claude-opus-4-1" (its output limit less 1024 tokens for the answer); got 4294967295"#,
        ),
        // A tenant's model without a limit: the codec's default max_tokens is its limit, and
        // an effort's budget shrinks to fit.
        (
            Some(tenant),
            "anthropic",
            "my-claude",
            r#"{"effort":"high"}"#,
            "thinking 7168/8192",
        ),
        (
            Some(tenant),
            "anthropic",
            "small-claude",
            r#"{"effort":"low"}"#,
            "thinking 1024/2048",
        ),
        (
            Some(tenant),
            "anthropic",
            "tiny-claude",
            r#"{"effort":"low"}"#,
            r#"400: model "tiny-claude" has an output limit of 2047 tokens: too small for thinking (1024 tokens at least, and 1024 for the answer)"#,
        ),
        // OpenAI, both APIs: an effort only.
        (
            None,
            "openai",
            "gpt-5-mini",
            r#"{"effort":"medium"}"#,
            "effort medium",
        ),
        (
            None,
            "openai-compatible",
            "gpt-5",
            r#"{"effort":"high"}"#,
            "effort high",
        ),
        (
            None,
            "openai",
            "gpt-5-mini",
            r#"{"effort":"low","budgetTokens":2048}"#,
            "400: budgetTokens is for Anthropic models (extended thinking); openai models take an effort only",
        ),
        (
            None,
            "openai-compatible",
            "gpt-5",
            r#"{"effort":"low","budgetTokens":2048}"#,
            "400: budgetTokens is for Anthropic models (extended thinking); openai-compatible models take an effort only",
        ),
        // Models that do not reason, or that the table does not know.
        (
            None,
            "openai-compatible",
            "gpt-4o",
            r#"{"effort":"low"}"#,
            r#"400: model "gpt-4o" takes no reasoning setting (the model table does not mark it "reasoning": true): choose a reasoning model, or leave reasoning out"#,
        ),
        (
            None,
            "openai",
            "gpt-4.1",
            r#"{"effort":"low"}"#,
            r#"400: model "gpt-4.1" takes no reasoning setting (the model table does not mark it "reasoning": true): choose a reasoning model, or leave reasoning out"#,
        ),
        (
            None,
            "openai-compatible",
            "my-llama",
            r#"{"effort":"low"}"#,
            r#"400: model "my-llama" is not in the model table, so whether it takes a reasoning setting is unknown: an admin can add it to wuhu://workspace/config/models.json with "reasoning": true"#,
        ),
        // A tenant marks a model, or unmarks one.
        (
            Some(tenant),
            "openai-compatible",
            "gpt-4o",
            r#"{"effort":"low"}"#,
            "effort low",
        ),
        (
            Some(tenant),
            "openai",
            "gpt-5-nano",
            r#"{"effort":"low"}"#,
            r#"400: model "gpt-5-nano" takes no reasoning setting (the model table does not mark it "reasoning": true): choose a reasoning model, or leave reasoning out"#,
        ),
        // The fake provider takes none.
        (
            None,
            "fake",
            "fake-echo",
            r#"{"effort":"low"}"#,
            "400: the fake provider takes no reasoning setting",
        ),
        // Bad values never reach `plan`.
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"max"}"#,
            "json: unknown variant `max`, expected one of `low`, `medium`, `high` at line 1 column 15",
        ),
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"budgetTokens":2048}"#,
            "json: missing field `effort` at line 1 column 21",
        ),
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"low","budgetTokens":-1}"#,
            "json: invalid value: integer `-1`, expected u32 at line 1 column 33",
        ),
        (
            None,
            "anthropic",
            "claude-sonnet-4-5",
            r#"{"effort":"low","budget":2048}"#,
            "json: unknown field `budget`, expected `effort` or `budgetTokens` at line 1 column 24",
        ),
    ];
    for (tenant, provider, model, reasoning, want) in cases {
        assert_eq!(
            describe(*tenant, provider, model, reasoning),
            *want,
            "{provider} {model} {reasoning}"
        );
    }
}

/// Every plan keeps Anthropic's rules, for every effort and every budget around the bounds, on
/// every built-in model and limits near the smallest that allows thinking.
#[test]
fn every_thinking_plan_keeps_anthropics_rules() {
    let limits = [2048, 2049, 4096, 8192, 9216, 16_000, 32_000, 64_000];
    for limit in limits {
        let doc = format!(
            r#"{{"models":[{{"id":"m","provider":"anthropic","reasoning":true,"maxOutputTokens":{limit}}}]}}"#
        );
        let table = ModelTable::with_tenant(Some(&doc)).unwrap();
        let budgets = [
            None,
            Some(1023),
            Some(1024),
            Some(limit - 1025),
            Some(limit - 1024),
            Some(limit - 1023),
            Some(limit),
        ];
        for effort in [Effort::Low, Effort::Medium, Effort::High] {
            for budget_tokens in budgets {
                let reasoning = Reasoning {
                    effort,
                    budget_tokens,
                };
                match plan(&table, "anthropic", "m", &reasoning) {
                    Ok(Plan::Thinking {
                        budget_tokens: b,
                        max_tokens,
                    }) => {
                        assert!(b >= MIN_BUDGET_TOKENS, "{limit} {reasoning:?}");
                        assert!(b < max_tokens, "{limit} {reasoning:?}");
                        assert!(max_tokens <= limit, "{limit} {reasoning:?}");
                        assert!(max_tokens - b >= MIN_ANSWER_TOKENS, "{limit} {reasoning:?}");
                        if let Some(asked) = budget_tokens {
                            assert_eq!(b, asked);
                        }
                    }
                    Ok(other) => panic!("{other:?}"),
                    Err(ReasoningRefused::BudgetOutOfRange { .. }) => {
                        let asked = budget_tokens.unwrap();
                        assert!(asked < MIN_BUDGET_TOKENS || asked > limit - MIN_ANSWER_TOKENS);
                    }
                    Err(e) => panic!("{limit} {reasoning:?}: {e}"),
                }
            }
        }
    }
}

/// The request body each provider gets for each plan: the documented parameter, nothing else
/// changed, and never `temperature`, `top_k` or `tool_choice` beside Anthropic thinking.
#[test]
fn request_builders_write_the_plan_down() {
    use crate::llm::{HttpProvider, LlmRequest, ToolSchema};
    let request = |reasoning: Option<Plan>, max_output_tokens: Option<u32>| LlmRequest {
        model: "m".into(),
        system_prompt: "s".into(),
        messages: vec![crate::wire::Message::User {
            author: "a".into(),
            content: "hi".into(),
            queue_item_id: None,
            lane: None,
            acting_for: None,
        }],
        tools: vec![ToolSchema {
            name: "bash",
            description: "runs",
            parameters: serde_json::json!({"type": "object"}).into(),
        }],
        max_output_tokens,
        reasoning,
        images: Default::default(),
    };
    let thinking = Plan::Thinking {
        budget_tokens: 4096,
        max_tokens: 12288,
    };
    // (provider, plan, max_output_tokens) → the body's reasoning-related fields.
    let cases = [
        ("anthropic", None, None, r#"{"max_tokens":8192}"#),
        ("anthropic", None, Some(1000), r#"{"max_tokens":1000}"#),
        (
            "anthropic",
            Some(thinking),
            None,
            r#"{"max_tokens":12288,"thinking":{"budget_tokens":4096,"type":"enabled"}}"#,
        ),
        // The plan's max_tokens wins over the request's: it is what keeps the budget below it.
        (
            "anthropic",
            Some(thinking),
            Some(1000),
            r#"{"max_tokens":12288,"thinking":{"budget_tokens":4096,"type":"enabled"}}"#,
        ),
        ("openai", None, None, r#"{}"#),
        (
            "openai",
            Some(Plan::Effort(Effort::High)),
            None,
            r#"{"reasoning":{"effort":"high","summary":"auto"}}"#,
        ),
        ("openai-compatible", None, None, r#"{}"#),
        (
            "openai-compatible",
            Some(Plan::Effort(Effort::Low)),
            None,
            r#"{"reasoning_effort":"low"}"#,
        ),
    ];
    let keys = [
        "max_tokens",
        "thinking",
        "reasoning",
        "reasoning_effort",
        "temperature",
        "top_k",
        "top_p",
        "tool_choice",
    ];
    for (provider, plan, max_output_tokens, want) in cases {
        let http = HttpProvider::named(provider).unwrap().build_http_request(
            "http://x",
            None,
            &request(plan, max_output_tokens),
        );
        let body: serde_json::Value = serde_json::from_str(&http.body).unwrap();
        let picked: serde_json::Map<String, serde_json::Value> = keys
            .iter()
            .filter_map(|k| body.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect();
        assert_eq!(
            serde_json::Value::Object(picked).to_string(),
            want,
            "{provider} {plan:?}"
        );
    }
}
