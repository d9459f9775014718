//! Wuhu as an MCP client (issue 33, decision 0039): performs `wuhu_core::mcp_client` for the
//! `mcp_tools` and `mcp_call` tools, js `wuhu.mcp.*` and `read` of `wuhu://mcp/<server>/<uri>`.
//!
//! Each use reads the server documents afresh (an MCP call is a network round trip anyway, and
//! a change applies at the next call with nothing to tell). A call passes, in order: the turn's
//! rights (no guest), the server's `tools` filter, the egress rules of js `fetch`, the policy
//! (`tool: mcp_call`, `host`, `mcp: <server>/<tool>`), the server's `"approval": "ask"`; then the
//! exchange runs with the credential the turn may send to that host.
//!
//! MCP sessions (`Mcp-Session-Id`) are kept in the isolate per session, server and acting-for
//! set, at most [`MAX_KEPT_SESSIONS`], so a call after the first is one request.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use futures::future::{Either, select};
use futures::{FutureExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use worker::{
    AbortController, Delay, Fetch, Headers, Method, Request, RequestInit, RequestRedirect,
};
use wuhu_core::approvals::{self, Action, Approver};
use wuhu_core::authority::TurnRights;
use wuhu_core::environments::Attachment;
use wuhu_core::mcp_client::config::{self, Approval, Auth, McpServers, Server, Source};
use wuhu_core::mcp_client::exchange::{Answer, Exchange, HttpRequest, McpError, McpSession, Step};
use wuhu_core::mcp_client::legacy::{LegacyExchange, LegacyStep};
use wuhu_core::mcp_client::present::{self, Part, ResultPlan, Stored, ToolInfo};
use wuhu_core::tools::{names, truncate_head};
use wuhu_core::wire::runner::mcp::McpRequest;
use wuhu_core::wire::{BlobRef, ToolCall};

use crate::mcp_turn::{Caller, documents, egress, turn};
use crate::tool_context::{Ask, ToolContext, ToolOutput};

/// Most MCP sessions the isolate keeps (the oldest go first).
pub(crate) const MAX_KEPT_SESSIONS: usize = 256;

/// Kept MCP sessions by key (see [`target`]), each with when it was last used (a counter), and
/// the counter.
type KeptSessions = (HashMap<String, (McpSession, u64)>, u64);

thread_local! {
    static SESSIONS: RefCell<KeptSessions> = RefCell::new((HashMap::new(), 0));
}

fn kept(key: &str) -> Option<McpSession> {
    SESSIONS.with(|s| s.borrow().0.get(key).map(|(session, _)| session.clone()))
}

fn keep(key: &str, session: Option<&McpSession>) {
    SESSIONS.with(|s| {
        let (map, clock) = &mut *s.borrow_mut();
        match session {
            None => {
                map.remove(key);
            }
            Some(session) => {
                *clock += 1;
                map.insert(key.to_string(), (session.clone(), *clock));
                if map.len() > MAX_KEPT_SESSIONS
                    && let Some(oldest) = map
                        .iter()
                        .min_by_key(|(_, (_, used))| *used)
                        .map(|(k, _)| k.clone())
                {
                    map.remove(&oldest);
                }
            }
        }
    });
}

/// Whether `mcp_call` decides its policy itself: its host and tool are known only here.
pub(crate) fn checks_policy_itself(call: &ToolCall) -> bool {
    call.name == names::MCP_CALL
}

/// Whether this module runs `call`.
pub(crate) fn handles(call: &ToolCall) -> bool {
    call.name == names::MCP_CALL || call.name == names::MCP_TOOLS
}

/// What one request to `server` needs: where, with which credential, in which kept session.
struct Target<'a> {
    server: &'a Server,
    url: String,
    /// Replaced when an OAuth token is refreshed after the server refused it.
    authorization: RefCell<Option<String>>,
    key: String,
    /// Where the server's progress notifications are shown (a tool call's live output).
    progress: Option<Rc<dyn crate::tool_context::LiveOutput>>,
}

async fn target<'a>(caller: &Caller<'_>, server: &'a Server) -> Result<Target<'a>, String> {
    let name = &server.doc.name;
    if server.stdio.is_some() {
        // Reached through its environment's runner: no URL, no credential, nothing kept here.
        return Ok(Target {
            server,
            url: String::new(),
            authorization: RefCell::new(None),
            key: String::new(),
            progress: None,
        });
    }
    let url = egress(caller.env)
        .check(&server.doc.url)
        .map_err(|e| format!("MCP server {name:?}: {e}"))?;
    let host = server.host();
    let authorization = match &server.doc.auth {
        Auth::None => None,
        Auth::Oauth => Some(crate::mcp_oauth::authorization(caller, server, false).await?),
        Auth::Bearer { secret } => Some(
            crate::secrets::substitute_header(
                caller.env,
                caller.tenant,
                caller.secrets,
                &format!("Bearer {{{{secret:{secret}}}}}"),
                &host,
                caller.acting_for,
            )
            .map_err(|e| format!("MCP server {name:?}: its credential cannot be sent: {e}"))?,
        ),
    };
    let source = match &server.source {
        Source::Tenant => String::new(),
        Source::User(sub) => sub.clone(),
        Source::Environment(environment) => format!("env:{environment}"),
    };
    let auth = match &server.doc.auth {
        Auth::Bearer { secret } => secret.as_str(),
        _ => "",
    };
    let key = format!(
        "{}\u{1f}{}\u{1f}{source}\u{1f}{name}\u{1f}{url}\u{1f}{auth}\u{1f}{}",
        caller.tenant,
        caller.scope,
        caller.acting_for.join(",")
    );
    Ok(Target {
        server,
        url,
        authorization: RefCell::new(authorization),
        key,
        progress: None,
    })
}

/// One HTTP request of an exchange, with its whole answer read within `timeout` seconds.
/// Sends one HTTP request to the server (`url`: its URL, or an endpoint on its origin) with its
/// credential.
async fn fetch(
    target: &Target<'_>,
    method: Method,
    url: &str,
    headers: &[(&'static str, String)],
    body: Option<&str>,
    signal: &worker::AbortSignal,
) -> Result<worker::Response, McpError> {
    let transport = |e: worker::Error| McpError::Transport(e.to_string());
    let http_headers = Headers::new();
    for (name, value) in headers {
        http_headers.set(name, value).map_err(transport)?;
    }
    if let Some(value) = target.authorization.borrow().as_deref() {
        http_headers
            .set("authorization", value)
            .map_err(transport)?;
    }
    let mut init = RequestInit::new();
    // A redirect is not followed: the egress rules and the credential's hosts were checked
    // for this URL's origin only.
    init.with_method(method)
        .with_headers(http_headers)
        .with_redirect(RequestRedirect::Manual)
        .with_body(body.map(wasm_bindgen::JsValue::from_str));
    let http = Request::new_with_init(url, &init).map_err(transport)?;
    Fetch::Request(http)
        .send_with_signal(signal)
        .await
        .map_err(transport)
}

/// Shows a server's progress notes as the call's live output.
fn relay_progress(target: &Target<'_>, notes: Vec<wuhu_core::mcp_client::exchange::ProgressNote>) {
    if let Some(live) = &target.progress {
        for note in notes {
            live.push(&note.line());
        }
    }
}

async fn send(target: &Target<'_>, request: &HttpRequest, timeout: u32) -> Answer {
    let controller = AbortController::default();
    let signal = controller.signal();
    let perform = async {
        let mut response = fetch(
            target,
            Method::Post,
            &target.url,
            &request.headers,
            Some(&request.body),
            &signal,
        )
        .await?;
        let header = |name: &str| response.headers().get(name).ok().flatten();
        let status = response.status_code();
        let session_id = header("mcp-session-id");
        let mut reader = request.reader(header("content-type").as_deref());
        if let Ok(mut stream) = response.stream() {
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| McpError::Transport(e.to_string()))?;
                let pushed = reader.push(&chunk);
                relay_progress(target, reader.take_progress());
                match pushed {
                    Ok(true) => break,
                    Ok(false) => {}
                    Err(e) => {
                        return Ok(Answer {
                            status,
                            session_id,
                            body: Err(e),
                        });
                    }
                }
            }
        }
        Ok(Answer {
            status,
            session_id,
            body: reader.finish(),
        })
    };
    let timer = Delay::from(std::time::Duration::from_secs(u64::from(timeout)));
    match select(Box::pin(perform), timer.boxed_local()).await {
        Either::Left((Ok(answer), _)) => answer,
        Either::Left((Err(error), _)) => Answer {
            status: 0,
            session_id: None,
            body: Err(error),
        },
        Either::Right(_) => {
            controller.abort();
            Answer {
                status: 0,
                session_id: None,
                body: Err(McpError::Timeout(timeout)),
            }
        }
    }
}

/// Runs one request to the server (see [`send_request`]) and, when the session's tenant keeps
/// request logs, records it there: the method and params sent, the result or error received
/// (redacted as provider requests are).
async fn request(
    caller: &Caller<'_>,
    target: &Target<'_>,
    method: &str,
    params: Value,
) -> Result<Value, McpError> {
    let Some(log) = caller.ctx.and_then(|ctx| ctx.request_log.clone()) else {
        return send_request(caller, target, method, params).await;
    };
    let started_at_ms = worker::Date::now().as_millis();
    let request_body = json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string();
    let result = send_request(caller, target, method, params).await;
    let (status, response_body, error) = match &result {
        Ok(value) => (Some(200), json!({"result": value}).to_string(), None),
        Err(e) => (
            None,
            json!({"error": e.to_string()}).to_string(),
            Some(e.to_string()),
        ),
    };
    let url = match (&target.server.stdio, &target.server.source) {
        (Some(stdio), Source::Environment(environment)) => {
            format!("stdio:{environment}/{} ({})", stdio.name, stdio.command)
        }
        _ => target.url.clone(),
    };
    let response_total = response_body.len();
    log.record(wuhu_core::llm::request_log::Exchange {
        provider: "mcp".into(),
        model: target.server.doc.name.clone(),
        purpose: wuhu_core::llm::request_log::RequestPurpose::Mcp,
        url,
        request_headers: Vec::new(),
        request_body,
        status,
        response_headers: Vec::new(),
        response_body: response_body.into_bytes(),
        response_body_total: response_total,
        error,
        started_at_ms,
        duration_ms: worker::Date::now()
            .as_millis()
            .saturating_sub(started_at_ms),
    });
    result
}

/// Runs one request to the server (opening a session when none is kept). An OAuth server that
/// refuses the token (`401`) gets the request once more with a refreshed one.
async fn send_request(
    caller: &Caller<'_>,
    target: &Target<'_>,
    method: &str,
    params: Value,
) -> Result<Value, McpError> {
    if let Some(stdio) = &target.server.stdio {
        let (ctx, attachment) =
            environment_of(caller, target.server).map_err(McpError::Transport)?;
        let request = McpRequest {
            server: stdio.clone(),
            method: method.to_string(),
            params,
            timeout_seconds: None,
        };
        return crate::environment_tools::mcp_request(ctx, attachment, request).await;
    }
    match exchange(target, method, params.clone()).await {
        Err(McpError::Http { status: 401, .. }) if target.server.doc.auth == Auth::Oauth => {
            let refreshed = crate::mcp_oauth::authorization(caller, target.server, true)
                .await
                .map_err(McpError::Transport)?;
            *target.authorization.borrow_mut() = Some(refreshed);
            exchange(target, method, params).await
        }
        other => other,
    }
}

async fn exchange(target: &Target<'_>, method: &str, params: Value) -> Result<Value, McpError> {
    let timeout = target.server.timeout_seconds();
    if target.server.doc.transport == config::Transport::Sse {
        return legacy_exchange(target, method, params, timeout).await;
    }
    let mut exchange = Exchange::new(kept(&target.key), method, params);
    let mut step = exchange.start();
    loop {
        match step {
            Step::Send(http) => {
                let answer = send(target, &http, timeout).await;
                step = exchange.answered(answer);
            }
            Step::Done(result) => {
                // A failed exchange forgets its session: the next one opens a new one.
                keep(&target.key, result.as_ref().ok().and(exchange.session()));
                return result;
            }
        }
    }
}

/// The session and the attachment a stdio server of an environment runs in.
fn environment_of<'a>(
    caller: &Caller<'a>,
    server: &Server,
) -> Result<(&'a ToolContext, &'a Attachment), String> {
    let (Some(ctx), Source::Environment(environment)) = (caller.ctx, &server.source) else {
        return Err(format!(
            "MCP server {:?} runs in an environment, and only a session's turn reaches it",
            server.doc.name
        ));
    };
    let attachment = ctx
        .attachments
        .iter()
        .find(|a| a.name() == environment)
        .ok_or_else(|| format!("environment {environment:?} is not attached"))?;
    Ok((ctx, attachment))
}

/// The gates a request to a stdio server passes before it reaches its runner (the runner
/// owner's approval, as for `bash` there); nothing for a configured server. `part` tells this
/// approval apart from the call's others; `tool` is what asks.
async fn reach(caller: &Caller<'_>, server: &Server, part: &str, tool: &str) -> Result<(), String> {
    if server.stdio.is_none() {
        return Ok(());
    }
    let (ctx, attachment) = environment_of(caller, server)?;
    crate::environment_tools::admit_mcp(ctx, part, attachment, tool, None).await
}

/// One request over the legacy HTTP+SSE transport (`wuhu_core::mcp_client::legacy`): the
/// server's event stream is opened, read while the machine says so, and closed when it is done
/// or the server's timeout has passed (for the whole exchange). Nothing is kept between calls.
async fn legacy_exchange(
    target: &Target<'_>,
    method: &str,
    params: Value,
    timeout: u32,
) -> Result<Value, McpError> {
    let controller = AbortController::default();
    let signal = controller.signal();
    let perform = async {
        let mut exchange = LegacyExchange::new(&target.url, method, params)?;
        let mut response = fetch(
            target,
            Method::Get,
            &target.url,
            &LegacyExchange::open_headers(),
            None,
            &signal,
        )
        .await?;
        let content_type = response.headers().get("content-type").ok().flatten();
        let mut step = exchange.opened(response.status_code(), content_type.as_deref());
        let mut stream = match step {
            LegacyStep::Done(result) => return result,
            _ => response
                .stream()
                .map_err(|e| McpError::Transport(e.to_string()))?,
        };
        loop {
            step = match step {
                LegacyStep::Read => match stream.next().await {
                    Some(Ok(chunk)) => {
                        let next = exchange.read(&chunk);
                        relay_progress(target, exchange.take_progress());
                        next
                    }
                    Some(Err(e)) => return Err(McpError::Transport(e.to_string())),
                    None => exchange.ended(),
                },
                LegacyStep::Post { url, request } => {
                    let answer = fetch(
                        target,
                        Method::Post,
                        &url,
                        &request.headers,
                        Some(&request.body),
                        &signal,
                    )
                    .await?;
                    exchange.posted(answer.status_code())
                }
                LegacyStep::Done(result) => return result,
            };
        }
    };
    let timer = Delay::from(std::time::Duration::from_secs(u64::from(timeout)));
    let result = match select(Box::pin(perform), timer.boxed_local()).await {
        Either::Left((result, _)) => result,
        Either::Right(_) => Err(McpError::Timeout(timeout)),
    };
    // The stream (and a POST still under way) ends with the exchange.
    controller.abort();
    result
}

/// Every tool the server lists (at most [`present::MAX_TOOLS`]); `true` when it had more.
async fn list_tools(
    caller: &Caller<'_>,
    target: &Target<'_>,
) -> Result<(Vec<ToolInfo>, bool), McpError> {
    let mut tools = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..present::MAX_LIST_PAGES {
        let result = request(
            caller,
            target,
            "tools/list",
            present::list_params(cursor.as_deref()),
        )
        .await?;
        let (page, next) = present::tools_page(&result)?;
        tools.extend(page);
        if tools.len() >= present::MAX_TOOLS {
            tools.truncate(present::MAX_TOOLS);
            return Ok((tools, true));
        }
        match next {
            Some(next) => cursor = Some(next),
            None => return Ok((tools, false)),
        }
    }
    Ok((tools, cursor.is_some()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsArgs {
    server: Option<String>,
    query: Option<String>,
    offset: Option<usize>,
}

/// `mcp_tools`.
async fn tools(ctx: &ToolContext, arguments: &Value) -> Result<String, String> {
    let args: ToolsArgs = serde_json::from_value(arguments.clone())
        .map_err(|e| format!("Invalid arguments for mcp_tools: {e}"))?;
    let caller = Caller::of(ctx);
    let turn = turn(&caller).await?;
    let query = args.query.as_deref();
    let offset = args.offset.unwrap_or(0);
    let servers: Vec<&Server> = match &args.server {
        Some(name) => vec![turn.server(name)?],
        None if query.is_none() => {
            let (seen, shadowed) = turn.visible();
            return Ok(present::render_servers(
                &seen,
                &shadowed,
                turn.user_note.as_deref(),
            ));
        }
        // A query without a server searches every server.
        None => turn.visible().0,
    };
    let mut out = String::new();
    for server in servers {
        let part = format!("{}:{}", names::MCP_TOOLS, server.doc.name);
        if let Err(e) = reach(&caller, server, &part, names::MCP_TOOLS).await {
            if args.server.is_some() {
                return Err(e);
            }
            out.push_str(&format!("{e}\n"));
            continue;
        }
        let listed = match target(&caller, server).await {
            Ok(target) => list_tools(&caller, &target)
                .await
                .map_err(|e| present::error_text(&server.doc.name, "tools/list", &e)),
            Err(e) => Err(e),
        };
        match listed {
            Ok((tools, more)) => {
                out.push_str(&present::render_tools(server, &tools, query, offset, more));
            }
            Err(e) if args.server.is_some() => return Err(e),
            Err(e) => out.push_str(&format!("{e}\n")),
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallArgs {
    server: String,
    tool: String,
    #[serde(default)]
    arguments: Option<Value>,
}

/// The checks before a call runs: the tool filter, the policy, the server's own `ask`. `part`
/// tells this call's approvals apart from others of the same tool call (a script's).
async fn admit(
    ctx: &ToolContext,
    target: &Target<'_>,
    tool: &str,
    arguments: &Value,
    part: &str,
) -> Result<(), String> {
    let server = target.server;
    let name = &server.doc.name;
    if !server.offers(tool) {
        return Err(format!(
            "MCP server {name:?} does not offer the tool {tool:?} here (its entry's tools filter)."
        ));
    }
    let host = server.host();
    let subject = format!("{name}/{tool}");
    let details = json!({"server": name, "tool": tool, "arguments": shown_arguments(arguments)});
    if server.stdio.is_some() {
        // A stdio server runs on its environment's runner: the policy sees that environment and
        // runner, and the call passes the gates a `bash` call there passes.
        let (ctx, attachment) = environment_of(&Caller::of(ctx), server)?;
        let facts = wuhu_core::policy::Call {
            tool: names::MCP_CALL,
            mcp: Some(&subject),
            environment: Some(attachment.name()),
            runner: Some(&attachment.runner),
            runner_owner: Some(&attachment.runner_owner),
            ..Default::default()
        };
        return crate::environment_tools::admit_mcp(
            ctx,
            part,
            attachment,
            names::MCP_CALL,
            Some((&facts, details)),
        )
        .await;
    }
    let facts = wuhu_core::policy::Call {
        tool: names::MCP_CALL,
        host: Some(&host),
        mcp: Some(&subject),
        ..Default::default()
    };
    match crate::policy_gate::check(ctx, part, &facts, None, details.clone()).await {
        Ok(decided) => ctx.decided.borrow_mut().extend(decided.entries),
        Err(refused) => {
            ctx.decided.borrow_mut().extend(refused.entries);
            return Err(refused.content);
        }
    }
    if server.doc.approval == Approval::Ask {
        // The tenant's server asks the session's owner; a user's own server asks that user
        // (the turn acts for them alone).
        let approver = match &server.source {
            Source::Tenant | Source::Environment(_) => {
                Approver::SessionOwner(ctx.session.owner.clone())
            }
            Source::User(sub) => Approver::RunnerOwner(sub.clone()),
        };
        let what = format!(
            "call the tool {tool:?} of MCP server {name:?} (its entry asks before each call)"
        );
        let action = Action::Policy {
            tool: names::MCP_CALL,
            what: &what,
        };
        let mut data = details;
        data["tool"] = json!(names::MCP_CALL);
        let outcome = ctx
            .approvals
            .request(
                &format!("{part}:mcp"),
                Ask {
                    approver: approver.clone(),
                    turn_authors: &ctx.acting_for,
                    target: None,
                    action,
                    data,
                    always: None,
                    policy: false,
                },
            )
            .await;
        if let Some(error) = approvals::outcome_error(&outcome, &action, &approver) {
            return Err(error);
        }
    }
    Ok(())
}

/// The arguments as an approval shows them (bounded).
fn shown_arguments(arguments: &Value) -> String {
    const MAX_SHOWN: usize = 4 * 1024;
    let text = serde_json::to_string_pretty(arguments).unwrap_or_default();
    if text.len() > MAX_SHOWN {
        format!("{}…", &text[..text.floor_char_boundary(MAX_SHOWN)])
    } else {
        text
    }
}

/// Stores a plan's parts that are blobs; the shown images are attached to the result.
async fn store_parts(ctx: &ToolContext, plan: &ResultPlan) -> (Vec<Stored>, Vec<BlobRef>) {
    let mut stored = Vec::new();
    let mut attached = Vec::new();
    for part in &plan.parts {
        let Part::Store {
            media_type, bytes, ..
        } = part
        else {
            continue;
        };
        let put = crate::blob_store::put(
            &ctx.env,
            &ctx.session.tenant,
            &ctx.session.session_id,
            bytes.clone(),
            media_type,
        )
        .await;
        stored.push(match put {
            Ok((blob, shown)) => {
                let uri = blob.uri.clone();
                if shown {
                    attached.push(blob);
                }
                Ok((uri, shown))
            }
            Err(e) => Err(e),
        });
    }
    (stored, attached)
}

/// A result's text within the output limits: a longer one is stored whole as a blob, its head
/// shown.
async fn bounded_text(ctx: &ToolContext, text: String) -> String {
    let cut = truncate_head(&text);
    if !cut.truncated {
        return text;
    }
    let head = cut.text.clone();
    match crate::blob_store::put(
        &ctx.env,
        &ctx.session.tenant,
        &ctx.session.session_id,
        text.into_bytes(),
        "text/plain",
    )
    .await
    {
        Ok((blob, _)) => format!(
            "{head}\n[the result is longer: the whole of it is {} ({} bytes); read it with read and offset]",
            blob.uri, blob.size
        ),
        Err(e) => format!("{head}\n[the result is longer, and the rest was not kept: {e}]"),
    }
}

/// `mcp_call`.
async fn call_tool(ctx: &ToolContext, arguments: &Value) -> ToolOutput {
    let mut attached = Vec::new();
    let result = call_text(ctx, arguments, &mut attached).await;
    ToolOutput::with_blobs(result, attached)
}

async fn call_text(
    ctx: &ToolContext,
    arguments: &Value,
    attached: &mut Vec<BlobRef>,
) -> Result<String, String> {
    let args: CallArgs = serde_json::from_value(arguments.clone())
        .map_err(|e| format!("Invalid arguments for mcp_call: {e}"))?;
    let tool_arguments = match args.arguments {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(map)) => Value::Object(map),
        Some(_) => {
            return Err("Invalid arguments for mcp_call: arguments must be an object".into());
        }
    };
    let caller = Caller::of(ctx);
    let turn = turn(&caller).await?;
    let server = turn.server(&args.server)?;
    let mut target = target(&caller, server).await?;
    target.progress = Some(ctx.live.clone());
    admit(
        ctx,
        &target,
        &args.tool,
        &tool_arguments,
        crate::policy_gate::CALL_PART,
    )
    .await?;
    let params = present::call_params(&args.tool, &tool_arguments, Some(&ctx.call_id));
    let what = format!("tools/call {}", args.tool);
    let result = request(&caller, &target, "tools/call", params)
        .await
        .map_err(|e| present::error_text(&server.doc.name, &what, &e))?;
    let plan = present::plan_call_result(&result, &server.doc.name)
        .map_err(|e| present::error_text(&server.doc.name, &what, &e))?;
    let (stored, blobs) = store_parts(ctx, &plan).await;
    attached.extend(blobs);
    let text = bounded_text(ctx, present::render_result(&plan, &stored)).await;
    if plan.is_error {
        return Err(format!(
            "MCP server {:?}: the tool {:?} failed:\n{text}",
            server.doc.name, args.tool
        ));
    }
    Ok(text)
}

/// `read` of `wuhu://mcp/<server>/<uri>`.
pub(crate) async fn read_resource(
    ctx: &ToolContext,
    server: &str,
    uri: &str,
    attached: &mut Vec<BlobRef>,
) -> Result<String, String> {
    let caller = Caller::of(ctx);
    let turn = turn(&caller).await?;
    let server = turn.server(server)?;
    reach(&caller, server, crate::policy_gate::CALL_PART, names::READ).await?;
    let target = target(&caller, server).await?;
    let what = format!("resources/read {uri}");
    let result = request(&caller, &target, "resources/read", json!({"uri": uri}))
        .await
        .map_err(|e| present::error_text(&server.doc.name, &what, &e))?;
    let plan = present::plan_resource(&result, &server.doc.name)
        .map_err(|e| present::error_text(&server.doc.name, &what, &e))?;
    let (stored, blobs) = store_parts(ctx, &plan).await;
    attached.extend(blobs);
    Ok(present::render_result(&plan, &stored))
}

/// Runs `mcp_tools` or `mcp_call`.
pub(crate) async fn execute(ctx: &ToolContext, call: &ToolCall) -> ToolOutput {
    if call.name == names::MCP_CALL {
        call_tool(ctx, &call.arguments).await
    } else {
        ToolOutput::text(tools(ctx, &call.arguments).await)
    }
}

/// js `wuhu.mcp.list(server?)`: the servers (no server), or a server's tools, as JSON.
pub(crate) async fn js_list(ctx: &ToolContext, arg: &Value) -> Result<Value, String> {
    let caller = Caller::of(ctx);
    let turn = turn(&caller).await?;
    let Some(name) = arg.get("server").and_then(Value::as_str) else {
        let (seen, _) = turn.visible();
        return Ok(Value::Array(
            seen.iter()
                .map(|s| match &s.source {
                    // `{"source": "environment", "environment": "api"}`, not the `user` key.
                    Source::Environment(environment) => json!({"name": s.doc.name,
                        "host": s.host(), "source": "environment", "environment": environment}),
                    _ => json!({"name": s.doc.name, "host": s.host(), "source": s.source}),
                })
                .collect(),
        ));
    };
    let server = turn.server(name)?;
    let part = format!("{}:mcp:list:{name}", crate::policy_gate::CALL_PART);
    reach(&caller, server, &part, names::JS).await?;
    let target = target(&caller, server).await?;
    let (tools, _) = list_tools(&caller, &target)
        .await
        .map_err(|e| present::error_text(name, "tools/list", &e))?;
    Ok(Value::Array(
        tools
            .iter()
            .filter(|t| server.offers(&t.name))
            .map(|t| json!({"name": t.name, "description": t.description, "inputSchema": t.input_schema}))
            .collect(),
    ))
}

/// js `wuhu.mcp.call(server, tool, args)`: the server's result as it sent it (the script
/// reduces it before anything reaches the context). `n` numbers the script's calls (each its
/// own approval).
pub(crate) async fn js_call(ctx: &ToolContext, arg: &Value, n: u32) -> Result<Value, String> {
    let server_name = arg
        .get("server")
        .and_then(Value::as_str)
        .ok_or("mcp.call: server must be a string")?;
    let tool = arg
        .get("tool")
        .and_then(Value::as_str)
        .ok_or("mcp.call: tool must be a string")?;
    let arguments = match arg.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(map)) => Value::Object(map.clone()),
        Some(_) => return Err("mcp.call: arguments must be an object".into()),
    };
    let caller = Caller::of(ctx);
    let turn = turn(&caller).await?;
    let server = turn.server(server_name)?;
    let target = target(&caller, server).await?;
    let part = format!("{}:mcp:{n}", crate::policy_gate::CALL_PART);
    admit(ctx, &target, tool, &arguments, &part).await?;
    let mut result = request(
        &caller,
        &target,
        "tools/call",
        present::call_params(tool, &arguments, None),
    )
    .await
    .map_err(|e| present::error_text(server_name, &format!("tools/call {tool}"), &e))?;
    wuhu_core::secrets::mask_known_json(&ctx.masker, &mut result);
    Ok(result)
}

/// `GET /v1/mcp/servers`: the servers the caller's own turns would see.
pub(crate) async fn servers_route(
    env: &worker::Env,
    identity: &crate::auth::Identity,
) -> crate::http::ApiResult<worker::Response> {
    let acting_for = [identity.sub.clone()];
    let caller = Caller {
        env,
        tenant: &identity.tenant,
        scope: "",
        acting_for: &acting_for,
        rights: &TurnRights::People,
        secrets: &[],
        ctx: None,
    };
    let (tenant, user) = documents(&caller).await;
    let mut errors = Vec::new();
    let tenant = tenant.unwrap_or_else(|e| {
        errors.push(e);
        McpServers::default()
    });
    let user = match user {
        Some((_, Ok(servers))) => Some(servers),
        Some((_, Err(e))) => {
            errors.push(e);
            None
        }
        None => None,
    };
    let (seen, shadowed) = config::visible(&tenant, user.as_ref());
    let mut servers = Vec::with_capacity(seen.len());
    for server in &seen {
        let mut view = server.view();
        if server.doc.auth == Auth::Oauth {
            view.connected = Some(
                crate::mcp_oauth::connected(env, &identity.tenant, &identity.sub, server).await,
            );
        }
        servers.push(view);
    }
    let list = config::ServerList {
        servers,
        not_offered: shadowed.iter().map(|s| s.view()).collect(),
        errors,
    };
    Ok(crate::http::json_response(200, &list))
}

/// `GET /v1/mcp/servers/:name/tools`: asks the server now, as the caller's own turn would.
pub(crate) async fn tools_route(
    env: &worker::Env,
    identity: &crate::auth::Identity,
    name: &str,
) -> crate::http::ApiResult<worker::Response> {
    use crate::http::ApiError;
    if !config::valid_server_name(name) {
        return Err(ApiError::bad_request(format!(
            "{name:?} is not a server name"
        )));
    }
    let secrets = crate::tenant_index::sealed_secrets(env, &identity.tenant).await?;
    let acting_for = [identity.sub.clone()];
    let scope = format!("api:{}", identity.sub);
    let caller = Caller {
        env,
        tenant: &identity.tenant,
        scope: &scope,
        acting_for: &acting_for,
        rights: &TurnRights::People,
        secrets: &secrets,
        ctx: None,
    };
    let failed = |message: String| ApiError::new(502, "mcp_server_failed", message);
    let turn = turn(&caller)
        .await
        .map_err(|e| ApiError::new(409, "invalid_mcp_config", e))?;
    let server = turn.server(name).map_err(ApiError::not_found)?;
    let target = target(&caller, server).await.map_err(failed)?;
    let (tools, truncated) = list_tools(&caller, &target)
        .await
        .map_err(|e| failed(present::error_text(name, "tools/list", &e)))?;
    let list = config::ToolList {
        server: server.view(),
        tools: tools
            .into_iter()
            .map(|t| config::ToolView {
                offered: server.offers(&t.name),
                name: t.name,
                description: t.description,
                input_schema: t.input_schema,
            })
            .collect(),
        truncated,
    };
    Ok(crate::http::json_response(200, &list))
}
