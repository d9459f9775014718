//! The tools that act on child sessions (issue 12, `docs/orchestration.md`): `spawn_session`,
//! `send_to_session`, `wait_sessions`, `stop_session`, and the same for scripts
//! (`wuhu.sessions.spawn/send/wait/stop` in `js`, taking the same argument objects).
//!
//! A child is owned by the session's owner, with the session's access; its task is its first
//! message, sent by the owner through the tenant's concurrency gate. Only the session's own
//! children can be steered, awaited or stopped (`wuhu_core::orchestration::check_target`).

use serde::Deserialize;
use serde_json::{Value, json};
use wuhu_core::orchestration::{self, check_target};
use wuhu_core::tools::names;
use wuhu_core::wire::{ChildLifecycle, ChildStatus, Lane, ToolCall, normalize_title};

use crate::environment_tools;
use crate::session_client;
use crate::tool_context::ToolContext;
use wuhu_core::calls::session::{ChildInit, ChildInput, SessionInit};

/// The largest task or message a child is given.
const MAX_CONTENT_BYTES: usize = 256 * 1024;
/// How long `wait_sessions` (and `spawn_session` with `wait`) waits unless told.
const DEFAULT_WAIT_SECONDS: f64 = 300.0;
/// The longest wait.
const MAX_WAIT_SECONDS: f64 = 3600.0;
/// How often a wait looks at the children's recorded states (local, no I/O).
const WAIT_POLL_MS: u64 = 200;
/// How many children one wait names.
const MAX_WAIT_IDS: usize = 64;

/// Whether `call` is one of these tools.
pub(crate) fn handles(call: &ToolCall) -> bool {
    wuhu_core::tools::SPAWN_TOOLS.contains(&call.name.as_str())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SpawnArgs {
    task: String,
    title: Option<String>,
    model: Option<String>,
    environment: Option<String>,
    #[serde(default)]
    wait: bool,
    #[serde(default)]
    detached: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SendArgs {
    id: String,
    content: String,
    lane: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct WaitArgs {
    ids: Vec<String>,
    timeout_seconds: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StopArgs {
    id: String,
}

fn parse<T: for<'de> Deserialize<'de>>(name: &str, arguments: &Value) -> Result<T, String> {
    serde_json::from_value(arguments.clone())
        .map_err(|e| format!("Invalid arguments for {name}: {e}"))
}

/// Runs one tool call. `Err` is a tool error the model sees.
pub(crate) async fn execute(ctx: &ToolContext, call: &ToolCall) -> Result<String, String> {
    match call.name.as_str() {
        names::SPAWN_SESSION => {
            let args: SpawnArgs = parse(&call.name, &call.arguments)?;
            let wait = args.wait;
            let spawned = spawn(ctx, "", args).await?;
            let mut text = if wait {
                render_states(&spawned.states)
            } else {
                render_spawned(&spawned.states[0])
            };
            if let Some(environment) = spawned.environment {
                text.push_str(&format!("\nIts own environment: {environment}"));
            }
            Ok(text)
        }
        names::SEND_TO_SESSION => {
            let args: SendArgs = parse(&call.name, &call.arguments)?;
            let status = send(ctx, args).await?;
            Ok(match &status.lifecycle {
                ChildLifecycle::Queued { position, reason } => format!(
                    "Sent to {}. It waits for a slot first: place {position} in line ({reason}).",
                    status.id
                ),
                _ => format!("Sent to {}.", status.id),
            })
        }
        names::WAIT_SESSIONS => {
            let args: WaitArgs = parse(&call.name, &call.arguments)?;
            let states = wait(ctx, &args.ids, args.timeout_seconds).await?;
            Ok(render_states(&states))
        }
        names::STOP_SESSION => {
            let args: StopArgs = parse(&call.name, &call.arguments)?;
            stop(ctx, &args.id).await?;
            Ok(format!("Stopped {}.", args.id))
        }
        other => Err(format!("Tool {other:?} is not available here.")),
    }
}

/// `wuhu.sessions.spawn/send/wait/stop` in scripts: the same argument objects as the tools,
/// answered with JSON.
pub(crate) async fn js_call(ctx: &ToolContext, name: &str, arg: &Value) -> Result<Value, String> {
    match name {
        "sessions.spawn" => {
            let args: SpawnArgs = parse("wuhu.sessions.spawn", arg)?;
            let wait = args.wait;
            // A script may spawn several children in one call: each asks its own approvals.
            let part = format!("js-spawn-{}:", uuid::Uuid::new_v4());
            let spawned = spawn(ctx, &part, args).await?;
            if wait {
                Ok(to_json(&spawned.states))
            } else {
                Ok(to_json(&spawned.states[0]))
            }
        }
        "sessions.send" => {
            let args: SendArgs = parse("wuhu.sessions.send", arg)?;
            Ok(to_json(&send(ctx, args).await?))
        }
        "sessions.wait" => {
            let args: WaitArgs = parse("wuhu.sessions.wait", arg)?;
            Ok(to_json(&wait(ctx, &args.ids, args.timeout_seconds).await?))
        }
        "sessions.stop" => {
            let args: StopArgs = parse("wuhu.sessions.stop", arg)?;
            stop(ctx, &args.id).await?;
            Ok(json!({"id": args.id, "stopped": true}))
        }
        other => Err(format!("unknown host function {other}")),
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

fn check_content(what: &str, text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if text.len() > MAX_CONTENT_BYTES {
        return Err(format!(
            "{what} is {} bytes; the limit is {MAX_CONTENT_BYTES}",
            text.len()
        ));
    }
    Ok(())
}

/// Creates a child. Returns its status (with `wait`: once its first turn settled, or the
/// timeout passed).
///
/// `part` names the approvals this spawn asks among its call's (a definition's
/// `"approval":"ask"`, an inherited local environment).
async fn spawn(ctx: &ToolContext, part: &str, args: SpawnArgs) -> Result<Spawned, String> {
    check_content("task", &args.task)?;
    let title = match args.title.as_deref() {
        Some(t) => Some(normalize_title(t).map_err(|e| format!("title: {e}"))?),
        None => None,
    };
    if args
        .model
        .as_deref()
        .is_some_and(|m| m.trim().is_empty() || m.len() > 200)
    {
        return Err("model must be 1 to 200 characters".into());
    }
    if args.environment.as_deref().is_some_and(|e| e != "none") {
        // A guest's turn gives its child no environment (decision 0035); refused before the
        // child exists.
        ctx.rights.may_use_runners()?;
    }
    // The child's model follows the rule a switch follows, before anything is asked or made.
    let model = args
        .model
        .as_deref()
        .map(str::trim)
        .unwrap_or(&ctx.session.parent_session.model)
        .to_string();
    ctx.models
        .check(&ctx.session.parent_session.provider, &model)
        .map_err(|e| format!("Refused: {e}."))?;
    let id = uuid::Uuid::new_v4().to_string();
    let mut lineage = orchestration::child_lineage(
        &ctx.session.session_id,
        &ctx.session.lineage,
        &id,
        ctx.children.list().len(),
        args.detached,
        &ctx.limits,
    )
    .map_err(|e| format!("Refused: {e}."))?;
    // What the child spends counts against this session's budget and its ancestors': their
    // USD limits hold for its models too.
    lineage.usd_budget_above |= ctx.models.limits.session;
    let mut status = ChildStatus {
        id: id.clone(),
        title: title.clone(),
        detached: args.detached,
        lifecycle: ChildLifecycle::Spawning,
        cursor: 0,
        spent: None,
        branch: None,
        head: None,
    };
    // Recorded before the child exists, so its first report finds it.
    ctx.children.record(status.clone())?;
    // A failure before the child exists is final: past every report it could send.
    let fail = |mut status: ChildStatus, message: String| {
        status.lifecycle = ChildLifecycle::Failed {
            message: message.clone(),
        };
        status.cursor = u64::MAX;
        let _ = ctx.children.record(status);
        message
    };
    // `none`, `inherit` (the parent's directories, shared), or a definition made for the child:
    // how it gets its working directory is the definition's (a `worktree` definition gives it
    // its own worktree and branch), not this tool's.
    let (attachments, entries, construct) = match args.environment.as_deref().unwrap_or("none") {
        "none" => (Vec::new(), Vec::new(), None),
        // The parent's directories, shared: giving them to a child reaches their machines as
        // attaching them does, so each is asked as an attach is (nothing is created before
        // the answers).
        "inherit" => {
            for attachment in &ctx.attachments {
                let share = format!("{part}share:{}", attachment.name());
                if let Err(e) = environment_tools::approve_share(ctx, &share, attachment).await {
                    return Err(fail(status, e));
                }
            }
            (ctx.attachments.clone(), Vec::new(), None)
        }
        // Resolved and approved now (a spec that names nothing fails the spawn; a definition
        // with `"approval":"ask"` waits here, in the parent's transcript), made by the child
        // when it gets its slot: construct when ready (seed 002).
        spec => {
            let request = environment_tools::AttachRequest {
                approval_part: &format!("{part}env"),
                tool: names::SPAWN_SESSION,
                session_id: &id,
                spec,
                name: None,
                preference: "any",
            };
            match environment_tools::prepare(ctx, &request).await {
                Ok((resolved, entries)) => (Vec::new(), entries, Some(Box::new(resolved))),
                Err(e) => {
                    return Err(fail(
                        status,
                        format!("making the child's environment {spec:?} failed: {e}"),
                    ));
                }
            }
        }
    };
    let environment = construct.as_ref().map(|r| {
        format!(
            "{:?} on runner {:?}, made when the child starts (its first message says how)",
            r.spec.name, r.runner
        )
    });
    // The child starts with its parent's global context: the owner's (a guest owner's: its
    // binding's), read now, as a new session of theirs would.
    let global_context = crate::workspace_io::global_context_for(
        &ctx.env,
        &ctx.session.tenant,
        &ctx.session.owner,
        ctx.session.channel.as_deref(),
    )
    .await
    .unwrap_or_else(|e| {
        worker::console_error!("reading the child's global context failed: {}", e.message);
        None
    });
    let init = SessionInit {
        id: id.clone(),
        tenant: ctx.session.tenant.clone(),
        created_by: ctx.session.owner.clone(),
        provider: Some(ctx.session.parent_session.provider.clone()),
        model: Some(model),
        system_prompt: None,
        title,
        global_context,
        budget: None,
        reasoning: None,
        // The child of a chat session is one too: its guests keep their folder, and its
        // turns for nobody a guest's rights.
        channel: ctx.session.channel.clone(),
    };
    let child = ChildInit {
        lineage,
        access: ctx.session.parent_session.access,
        attachments,
        task: args.task,
        entries,
        construct,
        // Authority travels: the child's task acts for whom this turn acts for.
        acting_for: ctx.acting_for.clone(),
    };
    match session_client::init_child(&ctx.env, init, child).await {
        Ok(created) => {
            status.lifecycle = created.admission.lifecycle;
            status.cursor = created.admission.cursor;
            ctx.children.record(status.clone())?;
        }
        Err(e) => {
            return Err(fail(
                status,
                format!("creating the child failed: {}", e.message),
            ));
        }
    }
    let states = if args.wait {
        wait(ctx, &[id], None).await?
    } else {
        vec![current(ctx, &id).unwrap_or(status)]
    };
    Ok(Spawned {
        states,
        environment,
    })
}

/// What [`spawn`] did.
struct Spawned {
    /// The child's status (one), settled when the spawn waited.
    states: Vec<ChildStatus>,
    /// `Environment "repo" (...) attached ...`, when one was made for the child.
    environment: Option<String>,
}

fn current(ctx: &ToolContext, id: &str) -> Option<ChildStatus> {
    ctx.children.list().into_iter().find(|c| c.id == id)
}

fn target(ctx: &ToolContext, id: &str) -> Result<ChildStatus, String> {
    let known = current(ctx, id);
    check_target(
        &ctx.session.session_id,
        &ctx.session.lineage,
        id,
        known.is_some(),
    )
    .map_err(|e| format!("Refused: {e}."))?;
    known.ok_or_else(|| format!("session {id} is not a child of this session"))
}

async fn send(ctx: &ToolContext, args: SendArgs) -> Result<ChildStatus, String> {
    check_content("content", &args.content)?;
    let lane = match args.lane.as_deref().unwrap_or("followUp") {
        "followUp" => Lane::FollowUp,
        "steer" => Lane::Steer,
        other => return Err(format!("unknown lane {other:?}: use steer or followUp")),
    };
    let mut status = target(ctx, &args.id)?;
    let input = ChildInput {
        content: args.content,
        lane,
        author: ctx.session.owner.clone(),
        acting_for: ctx.acting_for.clone(),
    };
    let admission = session_client::child_input(&ctx.env, &ctx.session.tenant, &args.id, input)
        .await
        .map_err(|e| format!("Sending to {} failed: {}", args.id, e.message))?;
    status.lifecycle = admission.lifecycle;
    status.cursor = admission.cursor;
    ctx.children.record(status.clone())?;
    Ok(current(ctx, &args.id).unwrap_or(status))
}

/// Waits until every child in `ids` is settled (idle, failed, stopped) or the timeout passes;
/// returns their states as recorded (the children report to this session, so waiting reads
/// local state only).
async fn wait(
    ctx: &ToolContext,
    ids: &[String],
    timeout_seconds: Option<f64>,
) -> Result<Vec<ChildStatus>, String> {
    if ids.is_empty() || ids.len() > MAX_WAIT_IDS {
        return Err(format!("ids must name 1 to {MAX_WAIT_IDS} sessions"));
    }
    let timeout = timeout_seconds.unwrap_or(DEFAULT_WAIT_SECONDS);
    if !(timeout > 0.0 && timeout <= MAX_WAIT_SECONDS) {
        return Err(format!(
            "timeoutSeconds must be above 0 and at most {MAX_WAIT_SECONDS}"
        ));
    }
    for id in ids {
        target(ctx, id)?;
    }
    let deadline = worker::Date::now().as_millis() + (timeout * 1000.0) as u64;
    loop {
        let children = ctx.children.list();
        let states: Vec<ChildStatus> = ids
            .iter()
            .filter_map(|id| children.iter().find(|c| &c.id == id).cloned())
            .collect();
        let settled = states.iter().all(|c| c.lifecycle.is_settled());
        if settled || worker::Date::now().as_millis() >= deadline {
            return Ok(states);
        }
        worker::Delay::from(std::time::Duration::from_millis(WAIT_POLL_MS)).await;
    }
}

async fn stop(ctx: &ToolContext, id: &str) -> Result<(), String> {
    target(ctx, id)?;
    session_client::stop(&ctx.env, &ctx.owner_identity(), id)
        .await
        .map(|_| ())
        .map_err(|e| format!("Stopping {id} failed: {}", e.message))
}

fn describe(child: &ChildStatus) -> String {
    match &child.title {
        Some(title) => format!("{} ({title:?})", child.id),
        None => child.id.clone(),
    }
}

fn render_spawned(child: &ChildStatus) -> String {
    let name = describe(child);
    match &child.lifecycle {
        ChildLifecycle::Queued { position, reason } => format!(
            "Spawned child session {name}. It waits for a slot: place {position} in line ({reason}). It starts when a slot frees; you get a system message when it finishes."
        ),
        _ => format!(
            "Spawned child session {name}; it is working. You get a system message when it finishes (or call wait_sessions)."
        ),
    }
}

fn render_states(states: &[ChildStatus]) -> String {
    let mut out = String::new();
    for child in states {
        let name = describe(child);
        let line = match &child.lifecycle {
            ChildLifecycle::Idle {
                final_text: Some(text),
            } => format!("{name}: idle. Final message:\n{text}\n"),
            ChildLifecycle::Idle { final_text: None } => {
                format!("{name}: idle, without a final message.\n")
            }
            ChildLifecycle::Failed { message } => format!("{name}: failed: {message}\n"),
            ChildLifecycle::Queued { position, reason } => {
                format!("{name}: still waiting for a slot (place {position}: {reason}).\n")
            }
            other => format!("{name}: {} (not finished yet).\n", other.name()),
        };
        out.push_str(&line);
    }
    out
}
