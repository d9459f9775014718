//! Tools that involve environments: `request_environment`, `detach_environment`, and the tools
//! that run on a runner (`bash`, `edit`, `ls`, `find`, `grep`, and `read`/`write` for plain paths
//! and `wuhu://env/` URLs).
//!
//! A tool returns a [`ToolOutput`]: its result, the entries to show before it, and the change to
//! the session's attachments. The actor applies all three in one write; tools never reach back
//! into the session. The one service a tool may use is the approval gate
//! ([`crate::tool_context::ApprovalGate`]), to wait for a person's decision.
//!
//! Every call that reaches a runner (attach, detach, and each tool call in an environment)
//! first passes [`approve`]: work that reaches a local runner on the prompt of someone other
//! than its owner waits for the owner; a definition with `"approval":"ask"` waits for the
//! session's owner before attaching (`wuhu_core::approvals`).

mod job_tools;

use job_tools::job_tool;

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Value, json};
use wuhu_core::approvals::{self, Action, Approver, Facts, Target};
use wuhu_core::environments::{self, Attachment};
use wuhu_core::jobs::JobRecord;
use wuhu_core::tools::names;
use wuhu_core::wire::runner::JobState;
use wuhu_core::wire::runner::mcp;
use wuhu_core::wire::runner::{
    AttachOutcome, DetachOutcome, EnvironmentContext, RunnerMessage, ServerMessage,
};
use wuhu_core::wire::{
    ApprovalPolicy, EntryPayload, Message, ResolveEnvironmentResponse, ToolCall, custom_types,
};
use wuhu_core::workspace::{WuhuUrl, parse_wuhu_url};

use crate::http::ApiError;
use crate::internal::{self, codes};
use crate::tool_context::{Ask, AttachmentChange, ToolContext, ToolOutput};
use crate::{policy_gate, runner_client};

/// How long a runner may take to materialise an environment (startup scripts, git).
const ATTACH_TIMEOUT_MS: u64 = 10 * 60 * 1000;
/// Tool calls without their own timeout.
const DEFAULT_TOOL_TIMEOUT_MS: u64 = 30 * 60 * 1000;
/// How long starting a background job may take.
const JOB_START_TIMEOUT_MS: u64 = 60_000;

/// Sends `message` to a runner on behalf of the session's owner. A `tool_call` is recorded
/// while it runs, so stopping the step (or a restart) cancels it on the runner.
async fn call_runner(
    ctx: &ToolContext,
    runner: &str,
    runner_owner: &str,
    message: &ServerMessage,
    timeout_ms: u64,
) -> Result<(u64, Option<RunnerMessage>), ApiError> {
    let tracked = match message {
        ServerMessage::ToolCall { id, tool, .. } => {
            // A `bash` call's output is shown live as its tool call's.
            let live = (tool == names::BASH).then_some((ctx.call_id.as_str(), &*ctx.masker));
            Some(
                ctx.runner_calls
                    .track(id, runner, runner_owner, &ctx.session.owner, live),
            )
        }
        _ => None,
    };
    let reply = runner_client::call(
        &ctx.env,
        &ctx.session.tenant,
        &ctx.session.owner,
        runner,
        runner_owner,
        message,
        timeout_ms,
    )
    .await;
    if let (Some(_), ServerMessage::ToolCall { id, .. }, Err(e)) = (&tracked, message, &reply)
        && (e.code == internal::UNREACHABLE || e.status == 500)
    {
        // The hub gave no answer (it restarted, say): the command may still run and nobody
        // waits for it any more. Stop it; a runner that does not know the id ignores this.
        let cancelled = runner_client::cancel(
            &ctx.env,
            &ctx.session.tenant,
            &ctx.session.owner,
            runner,
            runner_owner,
            id,
        )
        .await;
        if let Err(c) = cancelled {
            worker::console_error!("cancelling {id} on runner {runner:?} failed: {}", c.message);
        }
    }
    drop(tracked);
    reply
}

/// Waits for whoever must approve giving a child session `attachment` (`spawn_session` with
/// `inherit`): sharing an environment reaches its machine as attaching it does, so it is asked
/// of the same person (the runner's owner, when the turn acts for anyone else). `part` names
/// this approval among the call's (see `ApprovalGate::request`).
pub(crate) async fn approve_share(
    ctx: &ToolContext,
    part: &str,
    attachment: &Attachment,
) -> Result<(), String> {
    ctx.rights.may_use_runners()?;
    let target = Target {
        runner: &attachment.runner,
        runner_owner: &attachment.runner_owner,
        runner_kind: attachment.runner_kind,
        policy: ApprovalPolicy::Auto,
    };
    let action = Action::Share {
        environment: attachment.name(),
    };
    let data = json!({
        "environment": attachment.name(),
        "runner": attachment.runner,
        "runnerOwner": attachment.runner_owner,
        "tool": names::SPAWN_SESSION,
    });
    approve(ctx, part, target, action, data, None).await
}

/// Waits for whoever must approve the call reaching `target` (nobody, mostly); `part` names
/// this approval among the call's (`""`: the call's own action). `approved_by` is the person
/// who already approved this very call when a policy rule asked: they are not asked again.
/// `Err` is the tool error the agent sees when the approval is denied, expires, is withdrawn
/// or cannot be asked.
async fn approve(
    ctx: &ToolContext,
    part: &str,
    target: Target<'_>,
    action: Action<'_>,
    data: Value,
    approved_by: Option<&str>,
) -> Result<(), String> {
    let grants = ctx.approvals.grants();
    let facts = Facts {
        turn_authors: &ctx.acting_for,
        session_owner: &ctx.session.owner,
        grants: &grants,
        now: wuhu_core::session::Millis(worker::Date::now().as_millis()),
    };
    let Some(approver) = approvals::required_approver(&target, &facts) else {
        return Ok(());
    };
    if let (Approver::RunnerOwner(sub) | Approver::SessionOwner(sub), Some(by)) =
        (&approver, approved_by)
        && sub == by
    {
        return Ok(());
    }
    let ask = Ask {
        approver: approver.clone(),
        turn_authors: &ctx.acting_for,
        target: Some(target),
        action,
        data,
        always: None,
        policy: false,
    };
    let outcome = ctx.approvals.request(part, ask).await;
    match approvals::outcome_error(&outcome, &action, &approver) {
        None => Ok(()),
        Some(error) => Err(error),
    }
}

fn notice(custom_type: &str, data: Value) -> EntryPayload {
    EntryPayload::Custom {
        custom_type: custom_type.into(),
        data,
    }
}

/// What the model is told when a runner call got no answer: each case says what happened to
/// the work and what to do next.
fn runner_error(runner: &str, e: &ApiError) -> String {
    match e.code.as_ref() {
        codes::RUNNER_DISCONNECTED => format!(
            "The call on runner {runner:?} was interrupted: {}. The runner stops whatever it \
             was running when its connection drops, so the work may be half done: check the \
             environment's state before you retry. The runner reconnects by itself if it is \
             still up.",
            e.message
        ),
        codes::RUNNER_NOT_CONNECTED => format!(
            "Runner {runner:?} is not connected, so nothing ran. Ask the user to start it \
             (wuhu-runner register --name {runner} ...) or use another environment."
        ),
        codes::TIMEOUT => format!(
            "No answer from runner {runner:?} in time ({}); the call was cancelled on the \
             runner. Pass a larger timeout, or split the work into shorter steps.",
            e.message
        ),
        internal::UNREACHABLE => format!(
            "The runner service could not be reached ({}), so the call on runner {runner:?} \
             may not have run; it was cancelled if it did. Retry.",
            e.message
        ),
        code => format!(
            "Runner {runner:?} could not be used ({code}): {}",
            e.message
        ),
    }
}

/// Whether this call's policy is checked here (`crate::policy_gate`), where its runner is known:
/// the tools that run in an environment, and `request_environment`.
pub(crate) fn checks_policy_itself(call: &ToolCall) -> bool {
    handles(call)
        && !matches!(
            call.name.as_str(),
            names::DETACH_ENVIRONMENT | names::JOB_STATUS | names::JOB_KILL
        )
}

/// Whether this call is handled here (rather than by the built-in tools).
pub(crate) fn handles(call: &ToolCall) -> bool {
    match call.name.as_str() {
        names::REQUEST_ENVIRONMENT | names::DETACH_ENVIRONMENT => true,
        names::JOB_STATUS | names::JOB_KILL => true,
        names::READ | names::WRITE => {
            let path = call
                .arguments
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("");
            matches!(parse_wuhu_url(path), None | Some(Ok(WuhuUrl::Env { .. })))
        }
        name => wuhu_core::tools::ENVIRONMENT_TOOLS.contains(&name),
    }
}

pub(crate) async fn execute(ctx: &ToolContext, call: &ToolCall) -> ToolOutput {
    // A guest's turn reaches no runner, whoever attached it (decision 0035).
    if let Err(refused) = ctx.rights.may_use_runners() {
        return ToolOutput::text(Err(refused));
    }
    match call.name.as_str() {
        names::REQUEST_ENVIRONMENT => request_environment(ctx, call).await,
        names::DETACH_ENVIRONMENT => detach_environment(ctx, call).await,
        names::JOB_STATUS | names::JOB_KILL => job_tool(ctx, call).await,
        _ => run_on_runner(ctx, call).await,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestArgs {
    spec: String,
    preference: Option<String>,
    name: Option<String>,
}

async fn request_environment(ctx: &ToolContext, call: &ToolCall) -> ToolOutput {
    let args: RequestArgs = match serde_json::from_value(call.arguments.clone()) {
        Ok(args) => args,
        Err(e) => {
            return ToolOutput::text(Err(format!(
                "Invalid arguments for request_environment: {e}"
            )));
        }
    };
    let preference = args.preference.as_deref().unwrap_or("any");
    if !matches!(preference, "local" | "cloud" | "any") {
        return ToolOutput::text(Err("preference must be local, cloud or any".into()));
    }
    let name = args.name.clone().unwrap_or_else(|| args.spec.clone());
    if ctx.attachments.iter().any(|a| a.name() == name) {
        return ToolOutput::text(Err(format!(
            "An environment named {name:?} is already attached; pass another name."
        )));
    }
    let request = AttachRequest {
        approval_part: "",
        tool: &call.name,
        session_id: &ctx.session.session_id,
        spec: &args.spec,
        name: args.name.as_deref(),
        preference,
    };
    let Attached {
        attachment,
        epoch,
        text,
        entries,
    } = match attach(ctx, request).await {
        Ok(attached) => attached,
        Err(e) => return ToolOutput::text(Err(e)),
    };
    let env = &attachment.environment;
    let content = format!(
        "{text}\nUse bash, read, write, edit, ls, find and grep there{}.",
        if ctx.attachments.is_empty() {
            String::new()
        } else {
            format!(" with environment={:?}", env.name)
        }
    );
    let mut validated = HashMap::new();
    validated.insert(env.name.clone(), epoch);
    ToolOutput {
        content,
        is_error: false,
        entries,
        change: Some(AttachmentChange::Attach(Box::new(attachment))),
        validated,
        blobs: Vec::new(),
    }
}

/// What [`attach`] is asked.
pub(crate) struct AttachRequest<'a> {
    /// Keys the approval a definition with `"approval":"ask"` waits for.
    pub(crate) approval_part: &'a str,
    /// The tool asking (shown with the approval).
    pub(crate) tool: &'a str,
    /// The session the environment is materialised for: the caller's own, or a child's
    /// (`spawn_session {environment: <spec>}`): a `worktree` or `folder-template` definition
    /// gives that session its own directory (the runner names it after the session).
    pub(crate) session_id: &'a str,
    /// A definition's name or id, or a runner's own environment.
    pub(crate) spec: &'a str,
    /// The name within the session (default: `spec`).
    pub(crate) name: Option<&'a str>,
    /// `local`, `cloud` or `any`.
    pub(crate) preference: &'a str,
}

/// An environment a runner materialised, with the entries that tell the session of it.
pub(crate) struct Attached {
    pub(crate) attachment: Attachment,
    /// The runner's connection epoch (its snapshot is valid on it).
    pub(crate) epoch: u64,
    /// `Environment "api" (...) attached ...`.
    pub(crate) text: String,
    /// The `environment_attached` notice and the AGENTS.md message.
    pub(crate) entries: Vec<EntryPayload>,
}

/// Resolves `request.spec` as the session's owner, waits for the approval it needs, and has the
/// runner materialise it for `request.session_id`. How the session gets its working directory
/// is the definition's (its kind), not the caller's: `local` is used in place, `folder-template`
/// and `worktree` make one per session.
///
/// # Errors
/// The message the agent sees.
pub(crate) async fn attach(
    ctx: &ToolContext,
    request: AttachRequest<'_>,
) -> Result<Attached, String> {
    let (resolved, entries) = prepare(ctx, &request).await?;
    let mut attached = materialise(
        &ctx.env,
        &ctx.session.tenant,
        &ctx.session.owner,
        request.session_id,
        &resolved,
    )
    .await?;
    attached.entries.splice(0..0, entries);
    Ok(attached)
}

/// The first half of [`attach`]: resolves `request.spec` as the session's owner and waits for
/// the policy and the approval it needs. Nothing is made yet: `spawn_session` keeps the answer
/// for the child, which has it made when it gets its slot ([`materialise`]; construct when
/// ready, seed 002). Returns the resolution and the entries of the decision (policy notices).
///
/// # Errors
/// The message the agent sees.
pub(crate) async fn prepare(
    ctx: &ToolContext,
    request: &AttachRequest<'_>,
) -> Result<(ResolveEnvironmentResponse, Vec<EntryPayload>), String> {
    ctx.rights.may_use_runners()?;
    let name = request
        .name
        .map(str::to_string)
        .unwrap_or_else(|| request.spec.to_string());
    let resolved = runner_client::resolve(
        &ctx.env,
        &ctx.session.tenant,
        &ctx.session.owner,
        request.session_id,
        request.spec,
        request.preference,
        request.name,
    )
    .await
    .map_err(|e| e.message)?;
    let mut entries = Vec::new();
    let target = Target {
        runner: &resolved.runner,
        runner_owner: &resolved.runner_owner,
        runner_kind: resolved.runner_kind,
        policy: resolved.approval,
    };
    let data = json!({
        "tool": request.tool,
        "environment": name,
        "spec": request.spec,
        "kind": resolved.spec.source.kind().as_str(),
    });
    // The policy decides first: a refused attach asks nobody. Its runner is known only now.
    // Matched as `request_environment` whoever asks (a child's `spawn_session` too): the
    // rule is about starting an environment.
    let facts = wuhu_core::policy::Call {
        tool: names::REQUEST_ENVIRONMENT,
        environment: Some(request.spec),
        runner: Some(&resolved.runner),
        runner_owner: Some(&resolved.runner_owner),
        cost_usd: wuhu_core::policy::cost_estimate(
            resolved.cost_per_hour_usd.as_ref(),
            wuhu_core::policy::DEFAULT_COST_SECONDS,
        ),
        ..Default::default()
    };
    let part = format!("{}{}", request.approval_part, policy_gate::CALL_PART);
    let approved_by = match policy_gate::check(ctx, &part, &facts, Some(target), json!({})).await {
        Ok(decided) => {
            entries.extend(decided.entries);
            decided.approved_by
        }
        Err(refused) => return Err(refused.content),
    };
    // The gate appends the request entry itself, so people see it while the call waits.
    let action = Action::Attach { environment: &name };
    approve(
        ctx,
        request.approval_part,
        target,
        action,
        data,
        approved_by.as_deref(),
    )
    .await?;
    Ok((resolved, entries))
}

/// The second half of [`attach`]: has the runner `resolved` names materialise it for
/// `session_id`, as `owner` (the session's), and returns the attachment with the entries
/// that tell the session of it. Asks nobody: [`prepare`] did.
///
/// # Errors
/// The message the agent sees.
pub(crate) async fn materialise(
    env: &worker::Env,
    tenant: &str,
    owner: &str,
    session_id: &str,
    resolved: &ResolveEnvironmentResponse,
) -> Result<Attached, String> {
    let name = resolved.spec.name.clone();
    let mut entries = Vec::new();
    let message = ServerMessage::Attach {
        id: uuid::Uuid::new_v4().to_string(),
        session_id: session_id.to_string(),
        spec: resolved.spec.clone(),
    };
    // An attach is no tool call: nothing to track or cancel.
    let reply = runner_client::call(
        env,
        tenant,
        owner,
        &resolved.runner,
        &resolved.runner_owner,
        &message,
        ATTACH_TIMEOUT_MS,
    )
    .await;
    let (epoch, environment) = match reply {
        Ok((
            epoch,
            Some(RunnerMessage::AttachResult {
                outcome: AttachOutcome::Ok { environment },
                ..
            }),
        )) => (epoch, environment),
        Ok((
            _,
            Some(RunnerMessage::AttachResult {
                outcome: AttachOutcome::Error(e),
                ..
            }),
        )) => {
            return Err(format!(
                "Attaching environment {name:?} on runner {:?} failed ({}):\n{}",
                resolved.runner, e.code, e.message
            ));
        }
        Ok((_, other)) => {
            return Err(format!(
                "Runner {:?} answered attach unexpectedly: {other:?}",
                resolved.runner
            ));
        }
        Err(e) => return Err(runner_error(&resolved.runner, &e)),
    };
    let attachment = Attachment {
        environment,
        runner: resolved.runner.clone(),
        runner_owner: resolved.runner_owner.clone(),
        runner_kind: resolved.runner_kind,
        definition_id: resolved.definition_id.clone(),
        definition_name: resolved.definition_name.clone(),
        secrets: resolved.secrets.clone(),
        cost_per_hour_usd: resolved.cost_per_hour_usd.clone(),
        mcp_servers: resolved.mcp_servers.clone(),
        attached_at: (js_sys::Date::now() / 1000.0) as i64,
    };
    let text = environments::attached_text(&attachment);
    let env = &attachment.environment;
    entries.push(notice(
        custom_types::ENVIRONMENT_ATTACHED,
        json!({
            "text": text,
            "environment": env.name,
            "kind": env.kind.as_str(),
            "os": env.os,
            "root": env.root,
            "runner": attachment.runner,
            "branch": env.branch,
            "snapshot": env.snapshot,
        }),
    ));
    if let Some(agents_md) = &env.agents_md {
        let file = env.agents_file();
        let truncated = if env.agents_md_truncated {
            " (truncated)"
        } else {
            ""
        };
        entries.push(EntryPayload::Message {
            message: Message::CustomMessage {
                custom_type: custom_types::AGENTS_MD.into(),
                content: format!(
                    "{file} of environment {:?} ({}/{file}){truncated}:\n\n{agents_md}",
                    env.name, env.root
                ),
                details: Some(
                    json!({"environment": env.name, "path": format!("{}/{file}", env.root)}),
                ),
            },
        });
    }
    Ok(Attached {
        attachment,
        epoch,
        text,
        entries,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DetachArgs {
    name: String,
}

async fn detach_environment(ctx: &ToolContext, call: &ToolCall) -> ToolOutput {
    let args: DetachArgs = match serde_json::from_value(call.arguments.clone()) {
        Ok(args) => args,
        Err(e) => {
            return ToolOutput::text(Err(format!(
                "Invalid arguments for detach_environment: {e}"
            )));
        }
    };
    let attachment = match environments::pick(&ctx.attachments, Some(&args.name)) {
        Ok(a) => a.clone(),
        Err(e) => return ToolOutput::text(Err(e)),
    };
    let action = Action::Detach {
        environment: &args.name,
    };
    let data = json!({"tool": call.name, "environment": args.name});
    if let Err(error) = approve(ctx, "", attachment_target(&attachment), action, data, None).await {
        return ToolOutput::text(Err(error));
    }
    let message = ServerMessage::Detach {
        id: uuid::Uuid::new_v4().to_string(),
        session_id: ctx.session.session_id.clone(),
        environment: attachment.environment.context(),
    };
    let reply = call_runner(
        ctx,
        &attachment.runner,
        &attachment.runner_owner,
        &message,
        ATTACH_TIMEOUT_MS,
    )
    .await;
    let (branch, problem) = match reply {
        Ok((
            _,
            Some(RunnerMessage::DetachResult {
                outcome: DetachOutcome::Ok { branch, .. },
                ..
            }),
        )) => (branch, None),
        Ok((
            _,
            Some(RunnerMessage::DetachResult {
                outcome: DetachOutcome::Error(e),
                ..
            }),
        )) => (attachment.environment.branch.clone(), Some(e.message)),
        Ok((_, other)) => (None, Some(format!("unexpected answer {other:?}"))),
        // Detaching still succeeds for the session: the environment is simply no longer used.
        Err(e) => (
            attachment.environment.branch.clone(),
            Some(runner_error(&attachment.runner, &e)),
        ),
    };
    let text = environments::detached_text(&args.name, branch.as_deref(), problem.as_deref());
    ToolOutput {
        content: text.clone(),
        is_error: false,
        entries: vec![notice(
            custom_types::ENVIRONMENT_DETACHED,
            json!({"text": text, "environment": args.name, "branch": branch}),
        )],
        change: Some(AttachmentChange::Detach(args.name)),
        validated: HashMap::new(),
        blobs: Vec::new(),
    }
}

/// Runs `bash`/`edit`/`ls`/`find`/`grep`/`read`/`write` on the runner of the target environment.
async fn run_on_runner(ctx: &ToolContext, call: &ToolCall) -> ToolOutput {
    let (requested, mut arguments) = environments::strip_environment_argument(&call.arguments);
    let mut requested = requested;
    // `wuhu://env/<name>/<path>` names the environment and a path below its root.
    if let Some(path) = arguments
        .get("path")
        .and_then(Value::as_str)
        .map(str::to_string)
    {
        match parse_wuhu_url(&path) {
            Some(Ok(WuhuUrl::Env { name, path })) => {
                requested = Some(name);
                arguments["path"] = Value::String(if path.is_empty() { ".".into() } else { path });
            }
            Some(Err(e)) => return ToolOutput::text(Err(e.to_string())),
            _ => {}
        }
    }
    let attachment = match environments::pick(&ctx.attachments, requested.as_deref()) {
        Ok(a) => a.clone(),
        Err(e) => return ToolOutput::text(Err(e)),
    };
    let name = attachment.name().to_string();
    let background = call.name == names::BASH
        && arguments.get("background").and_then(Value::as_bool) == Some(true);
    // The policy decides first, with everything known of the call (decision 0038).
    let facts = wuhu_core::policy::Call {
        tool: &call.name,
        environment: Some(&name),
        runner: Some(&attachment.runner),
        runner_owner: Some(&attachment.runner_owner),
        command: (call.name == names::BASH)
            .then(|| arguments.get("command").and_then(Value::as_str))
            .flatten(),
        paths: policy_gate::paths_of(&arguments),
        // A job keeps the environment busy for its `timeout` (an hour when it names none).
        cost_usd: background
            .then(|| {
                let seconds = arguments
                    .get("timeout")
                    .and_then(Value::as_f64)
                    .unwrap_or(wuhu_core::policy::DEFAULT_COST_SECONDS);
                wuhu_core::policy::cost_estimate(attachment.cost_per_hour_usd.as_ref(), seconds)
            })
            .flatten(),
        ..Default::default()
    };
    let details = policy_gate::change_details(&call.name, &arguments);
    let target = attachment_target(&attachment);
    let decided = match policy_gate::check(
        ctx,
        policy_gate::CALL_PART,
        &facts,
        Some(target),
        details.clone(),
    )
    .await
    {
        Ok(decided) => decided,
        Err(refused) => return refused,
    };
    let action = Action::Run {
        tool: &call.name,
        environment: &name,
    };
    // The owner sees exactly what would run or change (the command, the diff, the content)
    // and where (the path), as a policy's ask shows it.
    let mut data = json!({"tool": call.name, "environment": name});
    if let Some(path) = arguments.get("path").and_then(Value::as_str) {
        data["path"] = json!(path);
    }
    if let (Value::Object(data), Value::Object(details)) = (&mut data, details) {
        data.extend(details);
    }
    let approved_by = decided.approved_by.as_deref();
    if let Err(error) = approve(ctx, "", target, action, data, approved_by).await {
        let mut output = ToolOutput::text(Err(error));
        output.entries = decided.entries;
        return output;
    }
    let context = attachment.environment.context();
    let mut output = ToolOutput::text(Ok(String::new()));
    output.entries = decided.entries;
    // A snapshot not yet validated on this runner connection (after a restart of the session
    // or a reconnect of the runner) is checked first.
    if !ctx.validated.contains_key(&name) {
        validate(ctx, &attachment, &context, &mut output).await;
    }
    if background && let Err(refusal) = wuhu_core::jobs::may_start(ctx.jobs.running()) {
        return output.refused(refusal);
    }
    let timeout_ms = if background {
        // Only the start waits; the job's own `timeout` is the runner's business.
        JOB_START_TIMEOUT_MS
    } else {
        arguments
            .get("timeout")
            .and_then(Value::as_f64)
            .map(|s| (s * 1000.0) as u64 + 5_000)
            .unwrap_or(DEFAULT_TOOL_TIMEOUT_MS)
    };
    let command = arguments
        .get("command")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    // Output too long for the transcript (and files `read` cannot show as text) go to
    // storage straight from the runner, with a URL issued for this call.
    let upload = if !background && matches!(call.name.as_str(), names::BASH | names::READ) {
        crate::blob_store::issue_slot(&ctx.env, &ctx.session.tenant, &ctx.session.session_id)
            .inspect_err(|e| worker::console_error!("issuing an upload URL failed: {}", e.message))
            .ok()
    } else {
        None
    };
    // Secrets go to commands only, each call its own copy.
    let secret_env = if call.name == names::BASH {
        let wanted = wuhu_core::secrets::Wanted {
            names: &attachment.secrets,
            definition: attachment.definition_name.as_deref(),
            runner_owner: &attachment.runner_owner,
            acting_for: &ctx.acting_for,
        };
        match crate::secrets::for_call(&ctx.env, &ctx.session.tenant, &ctx.secrets, wanted) {
            Ok(values) => values,
            Err(refusal) => return output.refused(refusal),
        }
    } else {
        Default::default()
    };
    let message = ServerMessage::ToolCall {
        id: uuid::Uuid::new_v4().to_string(),
        session_id: ctx.session.session_id.clone(),
        environment: context.clone(),
        tool: call.name.clone(),
        arguments,
        timeout_ms: Some(timeout_ms),
        upload: upload.clone(),
        secret_env,
    };
    let reply = call_runner(
        ctx,
        &attachment.runner,
        &attachment.runner_owner,
        &message,
        timeout_ms + 5_000,
    )
    .await;
    match reply {
        Ok((
            epoch,
            Some(RunnerMessage::ToolResult {
                content,
                is_error,
                details,
                blobs,
                ..
            }),
        )) => {
            output.content = content;
            output.is_error = is_error;
            if !blobs.is_empty() {
                let (accepted, notes) = crate::blob_store::accept(
                    &ctx.env,
                    &ctx.session.tenant,
                    upload.as_ref(),
                    &blobs,
                )
                .await;
                // An image that is not accepted leaves nothing to show: the call failed.
                let image_refused = blobs
                    .iter()
                    .any(|b| wuhu_core::blobs::is_image(&b.media_type))
                    && !accepted
                        .iter()
                        .any(|b| wuhu_core::blobs::is_image(&b.media_type));
                output.is_error |= image_refused;
                for note in notes {
                    output
                        .content
                        .push_str(&format!("\n\n(The runner's upload was refused: {note}.)"));
                }
                output.blobs = accepted;
            }
            let job_id = details
                .as_ref()
                .and_then(|d| d.get("jobId"))
                .and_then(Value::as_str);
            if background
                && !is_error
                && let Some(job_id) = job_id
            {
                let record = JobRecord {
                    job_id: job_id.to_string(),
                    runner: attachment.runner.clone(),
                    runner_owner: attachment.runner_owner.clone(),
                    environment: name.clone(),
                    command: wuhu_core::jobs::short_command(&command),
                    started_at_ms: worker::Date::now().as_millis(),
                    state: JobState::Running,
                    absent_since_ms: None,
                    report: None,
                    reason: None,
                };
                if let Err(e) = ctx.jobs.record(record) {
                    output.content.push_str(&format!(
                        "\n\n(Warning: the session could not record the job ({e}); its end may not be reported.)"
                    ));
                }
            }
            let known = output
                .validated
                .get(&name)
                .or(ctx.validated.get(&name))
                .copied();
            if known.is_some_and(|k| k != epoch) {
                // The runner reconnected since the last validation: check the snapshot again.
                validate(ctx, &attachment, &context, &mut output).await;
            }
        }
        Ok((_, Some(RunnerMessage::Error { code, message, .. }))) => {
            output.content = format!(
                "Runner {:?} refused the call ({code}): {message}",
                attachment.runner
            );
            output.is_error = true;
        }
        Ok((_, other)) => {
            output.content = format!(
                "Runner {:?} answered unexpectedly: {other:?}",
                attachment.runner
            );
            output.is_error = true;
        }
        Err(e) => {
            output.content = runner_error(&attachment.runner, &e);
            output.is_error = true;
        }
    }
    output
}

/// Where calls to an attached environment go. The definition's policy applied when it was
/// attached; later calls follow the runner rule only.
fn attachment_target(attachment: &Attachment) -> Target<'_> {
    Target {
        runner: &attachment.runner,
        runner_owner: &attachment.runner_owner,
        runner_kind: attachment.runner_kind,
        policy: ApprovalPolicy::Auto,
    }
}

/// Validates a stored snapshot on its runner; adds a stale notice and a resume note.
async fn validate(
    ctx: &ToolContext,
    attachment: &Attachment,
    context: &EnvironmentContext,
    output: &mut ToolOutput,
) {
    let message = ServerMessage::Validate {
        id: uuid::Uuid::new_v4().to_string(),
        session_id: ctx.session.session_id.clone(),
        environment: context.clone(),
    };
    let reply = call_runner(
        ctx,
        &attachment.runner,
        &attachment.runner_owner,
        &message,
        60_000,
    )
    .await;
    let Ok((epoch, Some(RunnerMessage::ValidateResult { stale, .. }))) = reply else {
        return; // The call itself will report an unreachable runner.
    };
    let name = attachment.name().to_string();
    output.validated.insert(name.clone(), epoch);
    if !stale.is_empty() {
        let items: Vec<String> = stale.iter().map(|s| s.describe()).collect();
        output.entries.push(notice(
            custom_types::ENVIRONMENT_STALE,
            json!({"environment": name, "stale": stale, "text": format!("Environment {name:?}: {}.", items.join("; "))}),
        ));
    }
    output.entries.push(EntryPayload::Message {
        message: Message::CustomMessage {
            custom_type: custom_types::RESUME_NOTE.into(),
            content: environments::resume_note(&name, &stale),
            details: Some(json!({"environment": name, "stale": stale})),
        },
    });
}

/// The gates an MCP request to a stdio server of `attachment` passes before it reaches the
/// runner, the same as a `bash` call there: the turn's rights, the policy (when `policy` is
/// given: `mcp_call` with its `mcp` subject, the environment and the runner), and the runner
/// owner's approval when the turn acts for anyone else on their machine. `part` tells this
/// approval apart from the call's others; `tool` names what asks (`mcp_call`, `mcp_tools`, ...).
pub(crate) async fn admit_mcp(
    ctx: &ToolContext,
    part: &str,
    attachment: &Attachment,
    tool: &str,
    policy: Option<(&wuhu_core::policy::Call<'_>, Value)>,
) -> Result<(), String> {
    ctx.rights.may_use_runners()?;
    let target = attachment_target(attachment);
    let mut approved_by = None;
    if let Some((facts, details)) = policy {
        match policy_gate::check(ctx, part, facts, Some(target), details).await {
            Ok(decided) => {
                ctx.decided.borrow_mut().extend(decided.entries);
                approved_by = decided.approved_by;
            }
            Err(refused) => {
                ctx.decided.borrow_mut().extend(refused.entries);
                return Err(refused.content);
            }
        }
    }
    let action = Action::Run {
        tool,
        environment: attachment.name(),
    };
    let data = json!({"tool": tool, "environment": attachment.name()});
    approve(
        ctx,
        &format!("{part}:runner"),
        target,
        action,
        data,
        approved_by.as_deref(),
    )
    .await
}

/// Sends one MCP request to a stdio server of `attachment` (a `tool_call` of
/// [`mcp::TOOL`]) and answers the server's result. Call [`admit_mcp`] first.
pub(crate) async fn mcp_request(
    ctx: &ToolContext,
    attachment: &Attachment,
    request: mcp::McpRequest,
) -> Result<Value, wuhu_core::mcp_client::exchange::McpError> {
    use wuhu_core::mcp_client::exchange::McpError;
    let timeout_s = u64::from(
        request
            .timeout_seconds
            .unwrap_or(mcp::DEFAULT_TIMEOUT_SECONDS),
    );
    // The server's start (its `initialize`) may come first.
    let timeout_ms = (timeout_s + u64::from(mcp::START_TIMEOUT_SECONDS)) * 1000 + 5_000;
    // The server's secrets pass the rules a `bash` call's do; they travel with every request
    // (the runner uses them when the request starts the server, and masks answers with them).
    let wanted = wuhu_core::secrets::Wanted {
        names: &request.server.secrets,
        definition: attachment.definition_name.as_deref(),
        runner_owner: &attachment.runner_owner,
        acting_for: &ctx.acting_for,
    };
    let secret_env = crate::secrets::for_call(&ctx.env, &ctx.session.tenant, &ctx.secrets, wanted)
        .map_err(McpError::Transport)?;
    let arguments =
        serde_json::to_value(&request).map_err(|e| McpError::Transport(e.to_string()))?;
    let message = ServerMessage::ToolCall {
        id: uuid::Uuid::new_v4().to_string(),
        session_id: ctx.session.session_id.clone(),
        environment: attachment.environment.context(),
        tool: mcp::TOOL.to_string(),
        arguments,
        timeout_ms: Some(timeout_ms),
        upload: None,
        secret_env,
    };
    let reply = call_runner(
        ctx,
        &attachment.runner,
        &attachment.runner_owner,
        &message,
        timeout_ms + 5_000,
    )
    .await;
    match reply {
        Ok((
            _,
            Some(RunnerMessage::ToolResult {
                content,
                is_error: true,
                ..
            }),
        )) => Err(McpError::Transport(content)),
        Ok((_, Some(RunnerMessage::ToolResult { details, .. }))) => {
            let response: mcp::McpResponse = serde_json::from_value(details.unwrap_or_default())
                .map_err(|e| {
                    McpError::Malformed(format!("the runner's answer does not fit: {e}"))
                })?;
            match response.error {
                Some(e) => Err(McpError::Rpc {
                    code: e.code,
                    message: e.message,
                }),
                None => Ok(response.result),
            }
        }
        Ok((_, Some(RunnerMessage::Error { code, message, .. }))) => {
            Err(McpError::Transport(format!(
                "runner {:?} refused the call ({code}): {message}",
                attachment.runner
            )))
        }
        Ok((_, other)) => Err(McpError::Transport(format!(
            "runner {:?} answered unexpectedly: {other:?}",
            attachment.runner
        ))),
        Err(e) => Err(McpError::Transport(runner_error(&attachment.runner, &e))),
    }
}
