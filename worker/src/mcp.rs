//! `/mcp`: Wuhu as an MCP server (streamable HTTP, revision 2025-06-18; decision 0036). The
//! rules are `wuhu_core::mcp`; this module reads the request, performs a tool's API requests
//! through this Worker's own router with the caller's credentials (so each passes the checks of
//! the route it mirrors), and answers one JSON message.

use std::time::Duration;

use futures::StreamExt;

use serde_json::{Value, json};
use wasm_bindgen::JsValue;
use worker::{Delay, Env, Headers, Method, Request, RequestInit, Response};
use wuhu_core::mcp::progress::{self, WaitProgress};
use wuhu_core::mcp::{self, CallBody, HttpCall, Incoming, Plan, RpcError};
use wuhu_core::sse::{SseDecoder, SseItem};
use wuhu_core::wire::Entry;
use wuhu_core::wire::StreamEvent;

use crate::http::{ApiError, ApiResult, read_body_bounded};

/// The headers a tool's API request carries from the MCP request: the caller's credentials.
const CREDENTIALS: [&str; 3] = ["authorization", "cookie", "cf-access-jwt-assertion"];

/// The Worker's router, for the API requests the tools make (given by the router itself, so
/// this module does not reach back up to the crate root).
pub(crate) type Router =
    fn(Request, Env) -> std::pin::Pin<Box<dyn std::future::Future<Output = ApiResult<Response>>>>;

/// `/mcp` of an authenticated caller.
pub(crate) async fn route(mut req: Request, env: &Env, router: Router) -> ApiResult<Response> {
    if req.method() != Method::Post {
        // No server-to-client stream and no MCP session to end: the transport allows 405.
        let response = ApiError::new(
            405,
            "method_not_allowed",
            "this MCP server answers POST only (no server-to-client stream, no MCP session)",
        )
        .into_response();
        let _ = response.headers().set("allow", "POST");
        return Ok(response);
    }
    check_origin(&req, env)?;
    let version = req.headers().get("mcp-protocol-version").ok().flatten();
    if !mcp::version_supported(version.as_deref()) {
        return Ok(rpc_failure(&RpcError {
            code: mcp::codes::INVALID_REQUEST,
            message: format!(
                "MCP-Protocol-Version {:?} is not one this server speaks ({})",
                version.unwrap_or_default(),
                mcp::PROTOCOL_VERSIONS.join(", ")
            ),
        }));
    }
    let body = read_body_bounded(&mut req, mcp::MAX_REQUEST_BYTES).await?;
    let (id, method, params) = match mcp::parse(&body) {
        Ok(Incoming::Accepted) => return Ok(Response::empty()?.with_status(202)),
        Ok(Incoming::Request { id, method, params }) => (id, method, params),
        Err(e) => return Ok(rpc_failure(&e)),
    };
    let answer = match method.as_str() {
        "initialize" => Ok(mcp::initialize_result(&params, env!("CARGO_PKG_VERSION"))),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(mcp::tools()),
        "tools/call" => match mcp::plan(&params) {
            Ok(Plan::Wait {
                id: session,
                timeout_secs,
            }) => {
                let accept = req.headers().get("accept").ok().flatten();
                match WaitProgress::of(&params)
                    .filter(|_| progress::accepts_stream(accept.as_deref()))
                {
                    // The client asked for progress: the answer is an event stream.
                    Some(progress) => {
                        return streamed_wait(
                            req,
                            env,
                            router,
                            id,
                            session,
                            timeout_secs,
                            progress,
                        )
                        .await;
                    }
                    None => Ok(perform(
                        &req,
                        env,
                        router,
                        Plan::Wait {
                            id: session,
                            timeout_secs,
                        },
                    )
                    .await),
                }
            }
            Ok(plan) => Ok(perform(&req, env, router, plan).await),
            Err(e) => Err(e),
        },
        "resources/list" => match mcp::resources_list_call(&params) {
            Ok(call) => match api(&req, env, router, &call).await {
                Ok((status, body)) if (200..300).contains(&status) => {
                    Ok(mcp::resources_list_result(&body))
                }
                Ok((status, body)) => Err(RpcError {
                    code: mcp::codes::INTERNAL_ERROR,
                    message: format!("{status}: {body}"),
                }),
                Err(e) => Err(RpcError {
                    code: mcp::codes::INTERNAL_ERROR,
                    message: e.message,
                }),
            },
            Err(e) => Err(e),
        },
        "resources/templates/list" => Ok(mcp::resource_templates()),
        "resources/read" => match mcp::resource_read_call(&params) {
            Ok(call) => {
                let uri = params["uri"].as_str().unwrap_or_default();
                match api(&req, env, router, &call).await {
                    Ok((status, body)) => mcp::resource_read_result(uri, status, &body),
                    Err(e) => mcp::resource_read_result(uri, e.status, &json!({})),
                }
            }
            Err(e) => Err(e),
        },
        other => Err(RpcError {
            code: mcp::codes::METHOD_NOT_FOUND,
            message: format!("no method {other:?} (this server has tools and resources)"),
        }),
    };
    let message = match answer {
        Ok(result) => mcp::result_message(&id, result),
        Err(e) => mcp::error_message(Some(&id), &e),
    };
    Ok(crate::http::json_response(200, &message))
}

/// A browser page of another origin may not drive the server with the user's cookie (the
/// transport asks servers to check `Origin`): only this server's own origin and the listed ones.
fn check_origin(req: &Request, env: &Env) -> ApiResult<()> {
    let Some(origin) = req.headers().get("origin").ok().flatten() else {
        return Ok(());
    };
    let own = req.url().map(|u| u.origin().ascii_serialization()).ok();
    if own.as_deref() == Some(origin.as_str()) || crate::cors::listed_origin(req, env).is_some() {
        return Ok(());
    }
    Err(ApiError::new(
        403,
        "forbidden",
        format!("origin {origin} may not use this MCP server"),
    ))
}

/// A message that could not be read: `400` with a JSON-RPC error and no id.
fn rpc_failure(error: &RpcError) -> Response {
    crate::http::json_response(400, &mcp::error_message(None, error))
}

/// Performs a tool call; every failure is a tool result with `isError`.
async fn perform(req: &Request, env: &Env, router: Router, plan: Plan) -> Value {
    match plan {
        Plan::Http(call) => match api(req, env, router, &call).await {
            Ok((status, body)) => mcp::http_result(status, &body),
            Err(e) => failure(&e),
        },
        Plan::Wait { id, timeout_secs } => wait(req, env, router, &id, timeout_secs)
            .await
            .unwrap_or_else(|e| failure(&e)),
        Plan::Approvals { id } => approvals(req, env, router, &id)
            .await
            .unwrap_or_else(|e| failure(&e)),
    }
}

fn failure(e: &ApiError) -> Value {
    mcp::http_result(
        e.status,
        &json!({"error": {"code": e.code, "message": e.message}}),
    )
}

/// `GET path`, answered 2xx with a JSON body, or the error.
async fn get_json(req: &Request, env: &Env, router: Router, path: String) -> ApiResult<Value> {
    let call = HttpCall {
        method: "GET",
        path,
        body: None,
    };
    let (status, body) = api(req, env, router, &call).await?;
    if (200..300).contains(&status) {
        Ok(body)
    } else {
        Err(ApiError::new(
            status,
            body.pointer("/error/code")
                .and_then(Value::as_str)
                .unwrap_or("error")
                .to_string(),
            body.pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("the request failed")
                .to_string(),
        ))
    }
}

/// `session_wait`: polls the session until it is at rest or the time is up, then reads its tail.
async fn wait(
    req: &Request,
    env: &Env,
    router: Router,
    id: &str,
    timeout_secs: u64,
) -> ApiResult<Value> {
    let deadline = worker::Date::now().as_millis() + timeout_secs * 1000;
    let mut session = get_json(req, env, router, format!("/v1/sessions/{id}?limit=1")).await?;
    let mut settled = mcp::at_rest(&session);
    while !settled && worker::Date::now().as_millis() < deadline {
        Delay::from(Duration::from_millis(mcp::WAIT_POLL_MS)).await;
        session = get_json(req, env, router, format!("/v1/sessions/{id}?limit=1")).await?;
        settled = mcp::at_rest(&session);
    }
    let tail = if settled {
        page_from(req, env, router, id, mcp::tail_cursor(&session)).await?
    } else {
        Vec::new()
    };
    Ok(mcp::wait_result(&session, &tail, settled))
}

/// The most bytes of one follow-stream frame a streamed wait reads.
const MAX_FOLLOW_FRAME_BYTES: usize = 1024 * 1024;

/// A `session_wait` whose client asked for progress: an event stream of
/// `notifications/progress` (what the agent writes, `wuhu_core::mcp::progress`) while the
/// session runs, then the result. A session already at rest is answered as JSON at once; a
/// follow stream that cannot be opened leaves the wait to polling, without progress.
async fn streamed_wait(
    req: Request,
    env: &Env,
    router: Router,
    rpc_id: Value,
    session: String,
    timeout_secs: u64,
    progress: WaitProgress,
) -> ApiResult<Response> {
    let deadline = worker::Date::now().as_millis() + timeout_secs * 1000;
    let head = match get_json(&req, env, router, format!("/v1/sessions/{session}?limit=1")).await {
        Ok(head) => head,
        Err(e) => {
            let message = mcp::result_message(&rpc_id, failure(&e));
            return Ok(crate::http::json_response(200, &message));
        }
    };
    if mcp::at_rest(&head) {
        let result = perform(
            &req,
            env,
            router,
            Plan::Wait {
                id: session,
                timeout_secs: 0,
            },
        )
        .await;
        return Ok(crate::http::json_response(
            200,
            &mcp::result_message(&rpc_id, result),
        ));
    }
    let since = head
        .pointer("/session/lastCursor")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let follow = open_follow(&req, env, router, &session, since, timeout_secs).await;
    let state = Streamed {
        req,
        env: env.clone(),
        router,
        rpc_id,
        session,
        deadline,
        progress,
        follow,
        decoder: SseDecoder::new(MAX_FOLLOW_FRAME_BYTES),
        finished: false,
    };
    let stream = futures::stream::unfold(state, |mut state| async move {
        let chunk = state.next().await?;
        Some((Ok::<Vec<u8>, worker::Error>(chunk), state))
    });
    let headers = Headers::new();
    headers.set("content-type", "text/event-stream")?;
    headers.set("cache-control", "no-cache")?;
    Ok(Response::from_stream(stream)?.with_headers(headers))
}

/// The session's follow stream from `since`, through the router as the caller (`None` when it
/// does not open).
async fn open_follow(
    req: &Request,
    env: &Env,
    router: Router,
    session: &str,
    since: u64,
    timeout_secs: u64,
) -> Option<worker::ByteStream> {
    let call = HttpCall {
        method: "GET",
        path: format!(
            "/v1/sessions/{session}/follow?sinceCursor={since}&timeoutSeconds={timeout_secs}"
        ),
        body: None,
    };
    let mut response = api_response(req, env, router, &call).await.ok()?;
    if response.status_code() != 200 {
        return None;
    }
    response.stream().ok()
}

/// A streamed wait between two pulls of its answer.
struct Streamed {
    req: Request,
    env: Env,
    router: Router,
    rpc_id: Value,
    session: String,
    deadline: u64,
    progress: WaitProgress,
    follow: Option<worker::ByteStream>,
    decoder: SseDecoder,
    finished: bool,
}

impl Streamed {
    /// The next frame of the answer: a progress notification while the session runs, then
    /// the result (`None` after it).
    async fn next(&mut self) -> Option<Vec<u8>> {
        if self.finished {
            return None;
        }
        while let Some(follow) = &mut self.follow {
            let left = self
                .deadline
                .saturating_sub(worker::Date::now().as_millis());
            let timer = Delay::from(Duration::from_millis(left));
            let chunk = match futures::future::select(follow.next(), timer).await {
                futures::future::Either::Left((Some(Ok(chunk)), _)) => chunk,
                // Ended, failed, or the time is up: the result says where the session is.
                _ => {
                    self.follow = None;
                    break;
                }
            };
            let mut items = Vec::new();
            if self.decoder.push(&chunk, &mut items).is_err() {
                self.follow = None;
                break;
            }
            let events: Vec<StreamEvent> = items
                .into_iter()
                .filter_map(|item| match item {
                    SseItem::Frame(frame) => serde_json::from_str(&frame.data).ok(),
                    SseItem::Comment(_) => None,
                })
                .collect();
            let batch = self.progress.take(&events);
            if batch.stop {
                self.follow = None;
            }
            if let Some(notification) = batch.notification {
                return Some(progress::sse_frame(&notification).into_bytes());
            }
        }
        // Idle (or out of time): the wait's result, as a JSON answer would carry it (the wait
        // polls for whatever of the time is left, for a message still queued).
        let left = self
            .deadline
            .saturating_sub(worker::Date::now().as_millis());
        let plan = Plan::Wait {
            id: self.session.clone(),
            timeout_secs: left.div_ceil(1000),
        };
        let result = perform(&self.req, &self.env, self.router, plan).await;
        self.finished = true;
        Some(progress::sse_frame(&mcp::result_message(&self.rpc_id, result)).into_bytes())
    }
}

/// `approvals_list`: the pending requests among the session's last 200 entries.
async fn approvals(req: &Request, env: &Env, router: Router, id: &str) -> ApiResult<Value> {
    let head = get_json(req, env, router, format!("/v1/sessions/{id}?limit=1")).await?;
    let last = head
        .pointer("/session/lastCursor")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let page = page_from(req, env, router, id, last.saturating_sub(200)).await?;
    Ok(mcp::pending_approvals(&page))
}

/// The session's entries after cursor `since`, at most 200.
async fn page_from(
    req: &Request,
    env: &Env,
    router: Router,
    id: &str,
    since: u64,
) -> ApiResult<Vec<Entry>> {
    let page = get_json(
        req,
        env,
        router,
        format!("/v1/sessions/{id}?sinceCursor={since}&limit=200"),
    )
    .await?;
    Ok(page
        .get("transcript")
        .cloned()
        .and_then(|t| serde_json::from_value(t).ok())
        .unwrap_or_default())
}

/// One API request as the caller: this Worker's router, with the caller's credentials.
async fn api(req: &Request, env: &Env, router: Router, call: &HttpCall) -> ApiResult<(u16, Value)> {
    match api_response(req, env, router, call).await {
        Ok(mut response) => {
            let status = response.status_code();
            let text = response.text().await.unwrap_or_default();
            let body = if text.is_empty() {
                Value::Null
            } else {
                serde_json::from_str(&text).unwrap_or(Value::String(text))
            };
            Ok((status, body))
        }
        Err(e) => Ok((
            e.status,
            json!({"error": {"code": e.code, "message": e.message}}),
        )),
    }
}

/// The router's answer to one API request as the caller.
async fn api_response(
    req: &Request,
    env: &Env,
    router: Router,
    call: &HttpCall,
) -> ApiResult<Response> {
    let url = req
        .url()?
        .join(&call.path)
        .map_err(|e| ApiError::internal(format!("tool request URL: {e}")))?;
    let headers = Headers::new();
    for name in CREDENTIALS {
        if let Ok(Some(value)) = req.headers().get(name) {
            headers.set(name, &value)?;
        }
    }
    let mut init = RequestInit::new();
    init.with_method(match call.method {
        "POST" => Method::Post,
        "PUT" => Method::Put,
        _ => Method::Get,
    });
    match &call.body {
        Some(CallBody::Json(body)) => {
            headers.set("content-type", "application/json")?;
            init.with_body(Some(JsValue::from_str(&body.to_string())));
        }
        Some(CallBody::Text(text)) => {
            headers.set("content-type", "text/plain; charset=utf-8")?;
            init.with_body(Some(JsValue::from_str(text)));
        }
        None => {}
    }
    init.with_headers(headers);
    let sub = Request::new_with_init(url.as_str(), &init)?;
    router(sub, env.clone()).await
}
