//! The `js` tool: a script in the QuickJS sandbox, in a WebAssembly instance of its own.
//!
//! QuickJS never runs in the Worker's own instance. Each call instantiates the sandbox guest
//! module (`sandbox-guest/`, imported by `worker/entry.mjs` as a compiled module) and drives it
//! with `wuhu_sandbox::drive_guest`: the guest runs the script until it waits on a host call or
//! timer, this file performs those (`fetch` under the egress policy, `wuhu.sessions.*`,
//! `wuhu.workspace.*`, `wuhu.session.setModel`, timers) and resumes it. Every exception out of the instance (a trap, a
//! stack overflow deep in QuickJS's C code) is caught at the call and becomes a tool error; the
//! instance is then dropped, so nothing of it is ever run again.

use std::cell::Cell;
use std::time::Duration;

use futures::FutureExt;
use futures::future::LocalBoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};
use worker::{Delay, Fetch, Headers, Method, Request, RequestInit, RequestRedirect};
use wuhu_core::egress::{EgressPolicy, MAX_REQUESTS_PER_CALL, MAX_RESPONSE_BYTES_PER_CALL};
use wuhu_core::tools::truncate_head;
use wuhu_core::workspace::{WuhuUrl, parse_wuhu_url};
use wuhu_sandbox::protocol::{GuestInput, GuestLimits};
use wuhu_sandbox::{Clock, FETCH_PRELUDE, Host, HostFuture, Limits, Outcome};

use crate::tool_context::ToolContext;
use crate::{session_client, tenant_index, workspace_io};

mod instance;

use instance::GuestInstance;

/// The script-facing Wuhu API, built on the sandbox's raw `__host.call`.
const WUHU_PRELUDE: &str = r#"
globalThis.wuhu = Object.freeze({
  sessions: Object.freeze({
    list: (options) => __host.call("sessions.list", options ?? {}),
    get: (id, options) => __host.call("sessions.get", { ...(options ?? {}), id }),
    spawn: (args) => __host.call("sessions.spawn", args ?? {}),
    send: (args) => __host.call("sessions.send", args ?? {}),
    wait: (args) => __host.call("sessions.wait", args ?? {}),
    stop: (args) => __host.call("sessions.stop", args ?? {}),
  }),
  mcp: Object.freeze({
    list: (server) => __host.call("mcp.list", server === undefined ? {} : { server }),
    call: (server, tool, args) => __host.call("mcp.call", { server, tool, arguments: args ?? {} }),
  }),
  session: Object.freeze({
    setModel: (args) => __host.call("session.setModel", args ?? {}),
  }),
  workspace: Object.freeze({
    read: (path) => __host.call("workspace.read", { path }),
    write: (path, text) => __host.call("workspace.write", { path, text }),
    list: (prefix) => __host.call("workspace.list", { prefix: prefix ?? "" }),
    listPage: (prefix, cursor) =>
      __host.call("workspace.list", { prefix: prefix ?? "", cursor: cursor ?? null, paged: true }),
    remove: (path) => __host.call("workspace.remove", { path }),
  }),
});
"#;

struct WorkerClock;

impl Clock for WorkerClock {
    fn now_ms(&self) -> f64 {
        js_sys::Date::now()
    }
    fn sleep(&self, duration: Duration) -> LocalBoxFuture<'static, ()> {
        Box::pin(Delay::from(duration))
    }
}

struct JsHost<'a> {
    context: &'a ToolContext,
    policy: EgressPolicy,
    prelude: String,
    requests: Cell<u32>,
    response_bytes: Cell<usize>,
}

#[derive(Deserialize)]
struct FetchArg {
    url: String,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    headers: serde_json::Map<String, Value>,
    #[serde(default)]
    body: Option<String>,
}

impl JsHost<'_> {
    async fn fetch(&self, arg: Value) -> Result<Value, String> {
        // A guest's script has no network (decision 0035).
        self.context.rights.may_fetch()?;
        let arg: FetchArg =
            serde_json::from_value(arg).map_err(|e| format!("fetch: bad request: {e}"))?;
        let url = self.policy.check(&arg.url).map_err(|e| e.to_string())?;
        // Counted for the person the turn started for (else the session's owner) and the tenant.
        let ctx = self.context;
        let who = ctx.acting_for.first().unwrap_or(&ctx.session.owner);
        crate::rate_limit::check(
            &ctx.env,
            wuhu_core::rate_limits::RateAction::JsFetch,
            &ctx.session.tenant,
            who,
        )
        .await
        .map_err(|e| format!("egress refused: {}", e.message))?;
        let n = self.requests.get() + 1;
        if n > MAX_REQUESTS_PER_CALL {
            return Err(format!(
                "egress refused: at most {MAX_REQUESTS_PER_CALL} requests per js call"
            ));
        }
        self.requests.set(n);
        // The policy sees each fetch's host (decision 0038); its decisions show with the call.
        let host = worker::Url::parse(&url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string));
        let facts = wuhu_core::policy::Call {
            tool: wuhu_core::policy::JS_FETCH,
            host: host.as_deref(),
            ..Default::default()
        };
        let part = format!("{}:fetch:{n}", crate::policy_gate::CALL_PART);
        let details = serde_json::json!({"url": url});
        match crate::policy_gate::check(ctx, &part, &facts, None, details).await {
            Ok(decided) => ctx.decided.borrow_mut().extend(decided.entries),
            Err(refused) => {
                ctx.decided.borrow_mut().extend(refused.entries);
                return Err(format!("fetch: {}", refused.content));
            }
        }
        let method = match arg
            .method
            .as_deref()
            .unwrap_or("GET")
            .to_ascii_uppercase()
            .as_str()
        {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            "DELETE" => Method::Delete,
            "HEAD" => Method::Head,
            "OPTIONS" => Method::Options,
            other => return Err(format!("fetch: unsupported method {other}")),
        };
        let headers = Headers::new();
        let host = worker::Url::parse(&url)
            .ok()
            .and_then(|u| u.host_str().map(str::to_string))
            .unwrap_or_default();
        for (name, value) in &arg.headers {
            let value = value
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| value.to_string());
            // `{{secret:NAME}}` in a header becomes the value, for the hosts the secret names
            // (the script never sees it: what comes back is masked).
            let value = crate::secrets::substitute_header(
                &ctx.env,
                &ctx.session.tenant,
                &ctx.secrets,
                &value,
                &host,
                &ctx.acting_for,
            )
            .map_err(|e| format!("fetch: header {name}: {e}"))?;
            headers
                .set(name, &value)
                .map_err(|e| format!("fetch: bad header {name}: {e}"))?;
        }
        let mut init = RequestInit::new();
        // Redirects are not followed: the script sees the 3xx and may follow it, and the policy
        // applies again to the new location.
        init.with_method(method)
            .with_headers(headers)
            .with_redirect(RequestRedirect::Manual);
        if let Some(body) = arg.body {
            init.with_body(Some(wasm_bindgen::JsValue::from_str(&body)));
        }
        let request = Request::new_with_init(&url, &init).map_err(|e| format!("fetch: {e}"))?;
        let mut response = Fetch::Request(request)
            .send()
            .await
            .map_err(|e| format!("fetch failed: {e}"))?;
        // Refuse by Content-Length before reading, then read with a running cap, so a huge body
        // is never buffered whole.
        let budget = MAX_RESPONSE_BYTES_PER_CALL.saturating_sub(self.response_bytes.get());
        let over = || {
            format!(
                "egress refused: responses exceed {MAX_RESPONSE_BYTES_PER_CALL} bytes per js call"
            )
        };
        let declared = response
            .headers()
            .get("content-length")
            .ok()
            .flatten()
            .and_then(|v| v.trim().parse::<usize>().ok());
        if declared.is_some_and(|n| n > budget) {
            return Err(over());
        }
        let mut bytes = Vec::new();
        if let Ok(mut stream) = response.stream() {
            while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
                let chunk = chunk.map_err(|e| format!("fetch: reading the body failed: {e}"))?;
                if bytes.len() + chunk.len() > budget {
                    return Err(over());
                }
                bytes.extend_from_slice(&chunk);
            }
        }
        let total = self.response_bytes.get() + bytes.len();
        self.response_bytes.set(total);
        let headers: serde_json::Map<String, Value> = response
            .headers()
            .entries()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        // A server may echo what it was sent (a header with a secret): the script gets the
        // response with known secrets masked, so it cannot turn a value into something the
        // masker would miss (the detector applies to the js result, as to every tool's).
        let mut answer = json!({
            "status": response.status_code(),
            "headers": headers,
            "body": String::from_utf8_lossy(&bytes),
            "url": url,
        });
        wuhu_core::secrets::mask_known_json(&ctx.masker, &mut answer);
        Ok(answer)
    }

    async fn dispatch(&self, name: &str, arg: Value) -> Result<Value, String> {
        let ctx = self.context;
        let str_arg = |key: &str| {
            arg.get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("{name}: {key} must be a string"))
        };
        match name {
            "fetch" => self.fetch(arg.clone()).await,
            "mcp.list" => crate::mcp_client::js_list(ctx, &arg).await,
            "mcp.call" => {
                // A server call counts with the script's fetches.
                let n = self.requests.get() + 1;
                if n > MAX_REQUESTS_PER_CALL {
                    return Err(format!(
                        "mcp.call: at most {MAX_REQUESTS_PER_CALL} requests (fetch and mcp.call) per js call"
                    ));
                }
                self.requests.set(n);
                crate::mcp_client::js_call(ctx, &arg, n).await
            }
            "sessions.spawn" | "sessions.send" | "sessions.wait" | "sessions.stop" => {
                crate::orchestration_tools::js_call(ctx, name, &arg).await
            }
            "session.setModel" => {
                let set = crate::model_tool::set_model(ctx, &arg)?;
                Ok(json!({"provider": set.provider, "model": set.model, "switched": set.switched}))
            }
            "sessions.list" => {
                let limit = arg
                    .get("limit")
                    .and_then(Value::as_u64)
                    .unwrap_or(20)
                    .clamp(1, 100) as u32;
                let before = arg.get("before").and_then(Value::as_str);
                let page = tenant_index::list_for(
                    &ctx.env,
                    &ctx.session.tenant,
                    ctx.readers(),
                    limit,
                    before,
                )
                .await
                .map_err(|e| e.message)?;
                serde_json::to_value(page).map_err(|e| e.to_string())
            }
            "sessions.get" => {
                let id = str_arg("id")?;
                let since = arg.get("sinceCursor").and_then(Value::as_u64).unwrap_or(0);
                let limit = arg
                    .get("limit")
                    .and_then(Value::as_u64)
                    .unwrap_or(200)
                    .clamp(1, 1000);
                let page = session_client::read_for(
                    &ctx.env,
                    &ctx.session.tenant,
                    ctx.readers(),
                    &id,
                    since,
                    limit,
                )
                .await
                .map_err(|e| e.message)?;
                serde_json::to_value(page).map_err(|e| e.to_string())
            }
            "workspace.read" => {
                let path = workspace_path(&str_arg("path")?)?;
                ctx.rights.may_read_workspace(&path)?;
                let doc = workspace_io::read(&ctx.env, &ctx.session.tenant, &path)
                    .await
                    .map_err(|e| e.message)?;
                Ok(doc.map(|d| Value::String(d.content)).unwrap_or(Value::Null))
            }
            "workspace.write" => {
                let path = workspace_path(&str_arg("path")?)?;
                let text = str_arg("text")?;
                let summary = workspace_io::write(
                    &ctx.env,
                    &ctx.session.tenant,
                    &ctx.workspace_writer(),
                    &path,
                    &text,
                )
                .await
                .map_err(|e| e.message)?;
                serde_json::to_value(summary).map_err(|e| e.to_string())
            }
            "workspace.list" => {
                let prefix = workspace_path_or_prefix(&str_arg("prefix")?)?;
                ctx.rights.may_read_workspace(&prefix)?;
                let cursor = arg
                    .get("cursor")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let paged = arg.get("paged").and_then(Value::as_bool).unwrap_or(false);
                let page = workspace_io::list(&ctx.env, &ctx.session.tenant, &prefix, 1000, cursor)
                    .await
                    .map_err(|e| e.message)?;
                if paged {
                    serde_json::to_value(page).map_err(|e| e.to_string())
                } else {
                    serde_json::to_value(page.docs).map_err(|e| e.to_string())
                }
            }
            "workspace.remove" => {
                let path = workspace_path(&str_arg("path")?)?;
                workspace_io::remove(
                    &ctx.env,
                    &ctx.session.tenant,
                    &ctx.workspace_writer(),
                    &path,
                )
                .await
                .map(Value::Bool)
                .map_err(|e| e.message)
            }
            other => Err(format!("unknown host function {other}")),
        }
    }
}

/// A workspace path given as `notes/a.md` or `wuhu://workspace/notes/a.md`.
fn workspace_path(text: &str) -> Result<String, String> {
    match parse_wuhu_url(text) {
        None => Ok(text.to_string()),
        Some(Ok(WuhuUrl::Workspace(path))) => Ok(path),
        Some(Ok(_)) => Err(format!("{text} is not a workspace path")),
        Some(Err(e)) => Err(e.to_string()),
    }
}

fn workspace_path_or_prefix(text: &str) -> Result<String, String> {
    workspace_path(text)
}

impl Host for JsHost<'_> {
    fn call<'a>(&'a self, name: &str, arg: Value) -> HostFuture<'a> {
        let name = name.to_string();
        async move { self.dispatch(&name, arg).await }.boxed_local()
    }
    fn prelude(&self) -> &str {
        &self.prelude
    }
}

/// Default work budget (steps). Deployed Workers freeze `Date.now()` during CPU work, so the
/// time limit alone cannot stop a busy loop there; the work budget can. 1 000 steps keeps the
/// costliest loop bodies measured well inside a Durable Object's 30 s of CPU (decision 0006).
const DEFAULT_MAX_STEPS: u64 = 1_000;

fn limits(env: &worker::Env) -> Limits {
    let max_steps = env
        .var("WUHU_SANDBOX_MAX_STEPS")
        .ok()
        .and_then(|v| v.to_string().parse::<u64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_MAX_STEPS);
    Limits {
        max_steps,
        ..Limits::default()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsArgs {
    code: String,
}

/// Runs the `js` tool. `Err` is a tool error the model sees (with console output).
pub(crate) async fn run(context: &ToolContext, arguments: &Value) -> Result<String, String> {
    let args: JsArgs = serde_json::from_value(arguments.clone())
        .map_err(|e| format!("Invalid arguments for js: {e}"))?;
    let allow = context
        .env
        .var("WUHU_SANDBOX_EGRESS_ALLOW")
        .map(|v| v.to_string())
        .unwrap_or_default();
    let host = JsHost {
        context,
        policy: EgressPolicy::from_allowlist(&allow),
        prelude: format!("{FETCH_PRELUDE}\n{WUHU_PRELUDE}"),
        requests: Cell::new(0),
        response_bytes: Cell::new(0),
    };
    let input = GuestInput {
        code: args.code,
        prelude: host.prelude.clone(),
        limits: GuestLimits::from(&limits(&context.env)),
    };
    let outcome = match GuestInstance::new() {
        Ok(mut guest) => {
            wuhu_sandbox::drive_guest(&mut guest, &input, &host, &WorkerClock).await
            // `guest` is dropped here: an instance runs one script, whatever happened.
        }
        Err(message) => {
            worker::console_error!("js: cannot instantiate the sandbox: {message}");
            return Err(format!(
                "internal error: the js sandbox is unavailable ({message})"
            ));
        }
    };
    format_outcome(&outcome)
}

fn format_outcome(outcome: &Outcome) -> Result<String, String> {
    let mut console = outcome.console_text();
    if outcome.console_truncated {
        console.push_str("\n[console output truncated]");
    }
    let console_part = if console.trim().is_empty() {
        String::new()
    } else {
        format!("\n\nconsole:\n{console}")
    };
    match &outcome.result {
        Ok(value) => {
            let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into());
            let cut = truncate_head(&format!("{text}{console_part}"));
            let mut out = cut.text;
            if cut.truncated {
                out.push_str("\n[output truncated: return less, or write large results to wuhu://workspace/]");
            }
            Ok(out)
        }
        Err(error) => {
            let mut text = format!("{} error: {}", error.kind.as_str(), error.message);
            if let Some(stack) = &error.stack {
                text.push_str(&format!("\n{stack}"));
            }
            Err(truncate_head(&format!("{text}{console_part}")).text)
        }
    }
}
