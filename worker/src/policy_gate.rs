//! The policy engine's host side (decision 0038): reads the policy documents, asks
//! `wuhu_core::policy::evaluate` about a call and performs its verdict — a tool error for
//! `deny`, the session's approval gate for `ask`, a `wuhu_policy_decision_v1` entry for every
//! decision a rule made.
//!
//! The documents themselves are read by `crate::policy_book`.

use serde_json::{Value, json};
use wuhu_core::approvals::{self, Action, Approver, Target};
use wuhu_core::policy::{self, Call, Decision, Policy, Verdict};
use wuhu_core::wire::{EntryPayload, custom_types};

use crate::tool_context::{Ask, ToolContext, ToolOutput};

/// The approval part of a tool call's own policy ask (see `ApprovalGate::request`).
pub(crate) const CALL_PART: &str = "policy";

/// What a call may do after the policy decided: run (with the decision's entry, if a rule
/// made one), or not (the tool error, and the entry).
pub(crate) type Checked = Result<Decided, ToolOutput>;

/// A call the policy lets run.
#[derive(Default)]
pub(crate) struct Decided {
    /// The decision's entry (none when no rule matched).
    pub(crate) entries: Vec<EntryPayload>,
    /// The person who approved it when a rule asked: the approvals that hold without policy
    /// do not ask them again about the same call.
    pub(crate) approved_by: Option<String>,
}

/// Decides `call` and performs the decision. `target` is where it runs (for the approval's
/// text and the runner owner's grants); `part` tells this approval apart from others of the
/// same tool call (`"policy"` for the call itself); `details` go into an approval request (a
/// diff, say).
pub(crate) async fn check(
    ctx: &ToolContext,
    part: &str,
    call: &Call<'_>,
    target: Option<Target<'_>>,
    details: Value,
) -> Checked {
    let user = match call.runner_owner {
        Some(sub) => match ctx.policy.user(&ctx.env, &ctx.session.tenant, sub).await {
            Ok(policy) => Some((sub, policy)),
            Err(e) => {
                return Err(ToolOutput::text(Err(format!(
                    "The runner owner's policy is unusable, so the call did not run: {e}"
                ))));
            }
        },
        None => None,
    };
    let user = user.as_ref().map(|(sub, p)| (*sub, p.as_ref()));
    let Some(verdict) = policy::evaluate(ctx.policy.tenant(), user, call) else {
        return Ok(Decided::default());
    };
    let entry = |outcome: Option<&str>| {
        let mut data = policy::decision_entry(&verdict, call.tool, &ctx.call_id);
        if let Some(outcome) = outcome {
            data["outcome"] = json!(outcome);
        }
        EntryPayload::Custom {
            custom_type: custom_types::POLICY_DECISION.into(),
            data,
        }
    };
    match verdict.decision {
        Decision::Allow => Ok(Decided {
            entries: vec![entry(None)],
            approved_by: None,
        }),
        Decision::Deny => {
            let mut output = ToolOutput::text(Err(verdict.deny_text()));
            output.entries.push(entry(None));
            Err(output)
        }
        Decision::Ask => ask(ctx, part, call, target, details, &verdict)
            .await
            .map(|(outcome, approved_by)| Decided {
                entries: vec![entry(Some(outcome))],
                approved_by,
            })
            .map_err(|error| {
                let mut output = ToolOutput::text(Err(error));
                output.entries.push(entry(Some("refused")));
                output
            }),
    }
}

/// Waits for the person a rule's `ask` names, unless a runner owner's "approve for this
/// session" already covers the turn. `Ok` names how it was approved.
async fn ask(
    ctx: &ToolContext,
    part: &str,
    call: &Call<'_>,
    target: Option<Target<'_>>,
    details: Value,
    verdict: &Verdict,
) -> Result<(&'static str, Option<String>), String> {
    let approver = approvals::policy_approver(&verdict.rule, &ctx.session.owner);
    let person = match &approver {
        Approver::RunnerOwner(sub) | Approver::SessionOwner(sub) => sub.clone(),
    };
    let now = wuhu_core::session::Millis(worker::Date::now().as_millis());
    let grants = ctx.approvals.grants();
    if approvals::policy_ask_covered(&approver, &grants, &ctx.acting_for, now) {
        // Nobody answered this call: the approvals that hold without policy still ask.
        return Ok(("approved for this session", None));
    }
    let what = verdict.ask_text();
    let action = Action::Policy {
        tool: call.tool,
        what: &what,
    };
    let mut data = details;
    if !data.is_object() {
        data = json!({});
    }
    data["tool"] = json!(call.tool);
    data["policy"] = serde_json::to_value(verdict).unwrap_or_default();
    if let Some(environment) = call.environment {
        data["environment"] = json!(environment);
    }
    let always = match &approver {
        Approver::RunnerOwner(sub) | Approver::SessionOwner(sub) => {
            policy::always_rule(verdict, call, sub)
        }
    };
    let request = Ask {
        approver: approver.clone(),
        turn_authors: &ctx.acting_for,
        target,
        action,
        data,
        always,
        policy: true,
    };
    let outcome = ctx.approvals.request(part, request).await;
    match approvals::outcome_error(&outcome, &action, &approver) {
        None => Ok(("approved", Some(person))),
        Some(error) => Err(error),
    }
}

/// The facts of a file tool's call: its `path` argument.
pub(crate) fn paths_of(arguments: &Value) -> Vec<String> {
    arguments
        .get("path")
        .and_then(Value::as_str)
        .map(|p| vec![p.to_string()])
        .unwrap_or_default()
}

/// What an approval of a `write` or `edit` shows: the change itself (bounded).
pub(crate) fn change_details(tool: &str, arguments: &Value) -> Value {
    const MAX_SHOWN: usize = 4 * 1024;
    let text = |key: &str| {
        let s = arguments.get(key).and_then(Value::as_str).unwrap_or("");
        match s.char_indices().nth(MAX_SHOWN) {
            Some((cut, _)) => format!("{}…", &s[..cut]),
            None => s.to_string(),
        }
    };
    match tool {
        wuhu_core::tools::names::WRITE => json!({"content": text("content")}),
        wuhu_core::tools::names::EDIT => {
            let diff = |sign: char, s: &str| {
                s.lines()
                    .map(|l| format!("{sign}{l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            json!({"diff": format!("{}\n{}", diff('-', &text("oldText")), diff('+', &text("newText")))})
        }
        wuhu_core::tools::names::BASH => json!({"command": text("command")}),
        _ => json!({}),
    }
}

/// `GET /v1/policy/check`: what the tenant's policy (and `runnerOwner`'s own) would decide on
/// a call, without running anything. Any member may ask: the rules are the tenant's.
pub(crate) async fn check_route(
    req: &worker::Request,
    env: &worker::Env,
    identity: &crate::auth::Identity,
) -> crate::http::ApiResult<worker::Response> {
    use crate::http::ApiError;
    let query =
        policy::CheckQuery::parse(&crate::http::query_pairs(req)).map_err(ApiError::bad_request)?;
    if let Some(owner) = &query.runner_owner
        && !wuhu_core::authority::valid_name(owner)
    {
        return Err(ApiError::bad_request("runnerOwner must be a username"));
    }
    let tenant = &identity.tenant;
    let read = |path: String| async move {
        let doc = crate::workspace_io::read(env, tenant, &path).await?;
        Policy::parse(&path, doc.as_ref().map(|d| d.content.as_str()))
            .map_err(|e| ApiError::new(409, "invalid_policy", e.to_string()))
    };
    let tenant_policy = read(policy::TENANT_POLICY_PATH.to_string()).await?;
    let user_policy = match &query.runner_owner {
        Some(owner) => Some((owner.as_str(), read(policy::user_policy_path(owner)).await?)),
        None => None,
    };
    let user = user_policy.as_ref().map(|(sub, p)| (*sub, p));
    let answer = policy::check(&tenant_policy, user, &query);
    Ok(crate::http::json_response(200, &answer))
}
