//! Wuhu as an MCP server (`POST /mcp`, the Model Context Protocol's streamable HTTP transport,
//! revision 2025-06-18; issue 33, decision 0036): the rules, sans-IO. The Worker's `mcp.rs`
//! performs them.
//!
//! Each tool mirrors API routes and is performed as that route, with the caller's own
//! credentials ([`Plan::Http`]): the same authority checks, bounds and errors. A tool's failure is
//! a result with `isError` (the route's status, code and message), a protocol error a JSON-RPC
//! error. The server is stateless: no `Mcp-Session-Id`, no server-to-client stream (`GET /mcp` is
//! 405), one JSON answer per request.

use serde_json::{Map, Value, json};

use crate::wire::{Entry, EntryPayload, Message};

/// The protocol revisions this server speaks, newest first.
pub const PROTOCOL_VERSIONS: [&str; 2] = ["2025-06-18", "2025-03-26"];
/// The most bytes of a request body (a tool call's arguments; `workspace_write` content is
/// bounded by the workspace's own 1 MiB rule behind it).
pub const MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;
/// The longest `session_wait` (seconds): it polls the session until then.
pub const MAX_WAIT_SECONDS: u64 = 50;
/// How often `session_wait` looks (milliseconds).
pub const WAIT_POLL_MS: u64 = 250;
/// The most entries `session_read` returns at once (and its default).
pub const MAX_READ_ENTRIES: u64 = 200;
/// The most characters of a tool result's text (the structured content carries the rest).
pub const MAX_RESULT_TEXT_CHARS: usize = 64 * 1024;

/// JSON-RPC error codes.
pub mod codes {
    /// The body is not JSON.
    pub const PARSE_ERROR: i64 = -32700;
    /// Not a JSON-RPC 2.0 message.
    pub const INVALID_REQUEST: i64 = -32600;
    /// No such method.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Bad parameters, an unknown tool.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error (a route failed otherwise than by not finding the resource).
    pub const INTERNAL_ERROR: i64 = -32603;
    /// No such resource (or not one the caller may read), as the spec names it.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
}

/// A JSON-RPC error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcError {
    /// One of [`codes`].
    pub code: i64,
    /// What was wrong.
    pub message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }
}

/// What a `POST /mcp` body is.
#[derive(Clone, Debug, PartialEq)]
pub enum Incoming {
    /// A request: answered with a result or an error under its `id`.
    Request {
        /// Its id (a string or a number).
        id: Value,
        /// The method.
        method: String,
        /// Its params (`{}` when absent).
        params: Value,
    },
    /// A notification or a response to the server: `202 Accepted`, no body.
    Accepted,
}

/// Reads a `POST /mcp` body.
///
/// # Errors
/// [`codes::PARSE_ERROR`] (not JSON), [`codes::INVALID_REQUEST`] (a batch: revision 2025-06-18
/// has none; not a JSON-RPC 2.0 object; a request whose id is neither a string nor a number).
/// Either is answered with `400` and no id.
pub fn parse(body: &[u8]) -> Result<Incoming, RpcError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| RpcError::new(codes::PARSE_ERROR, format!("not JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(RpcError::new(
            codes::INVALID_REQUEST,
            "a message is one JSON-RPC 2.0 object (batches are not part of MCP 2025-06-18)",
        ));
    };
    if map.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(RpcError::new(
            codes::INVALID_REQUEST,
            "\"jsonrpc\" must be \"2.0\"",
        ));
    }
    let method = match map.remove("method") {
        Some(Value::String(method)) => method,
        Some(_) => {
            return Err(RpcError::new(
                codes::INVALID_REQUEST,
                "\"method\" must be a string",
            ));
        }
        // A response to a request of the server's: this server sends none, so it is dropped.
        None if map.contains_key("result") || map.contains_key("error") => {
            return Ok(Incoming::Accepted);
        }
        None => return Err(RpcError::new(codes::INVALID_REQUEST, "no \"method\"")),
    };
    let Some(id) = map.remove("id") else {
        return Ok(Incoming::Accepted);
    };
    if !(id.is_string() || id.is_i64() || id.is_u64()) {
        return Err(RpcError::new(
            codes::INVALID_REQUEST,
            "\"id\" must be a string or an integer",
        ));
    }
    let params = map.remove("params").unwrap_or_else(|| json!({}));
    if !params.is_object() {
        return Err(RpcError::new(
            codes::INVALID_REQUEST,
            "\"params\" must be an object",
        ));
    }
    Ok(Incoming::Request { id, method, params })
}

/// Whether an `MCP-Protocol-Version` header (absent: the client speaks 2025-03-26, as the
/// revision says) is one this server speaks.
pub fn version_supported(header: Option<&str>) -> bool {
    header.is_none_or(|v| PROTOCOL_VERSIONS.contains(&v.trim()))
}

/// The `initialize` result: the client's revision when this server speaks it, else the newest.
pub fn initialize_result(params: &Value, server_version: &str) -> Value {
    let asked = params.get("protocolVersion").and_then(Value::as_str);
    let version = asked
        .filter(|v| PROTOCOL_VERSIONS.contains(v))
        .unwrap_or(PROTOCOL_VERSIONS[0]);
    json!({
        "protocolVersion": version,
        "capabilities": {
            "tools": {"listChanged": false},
            "resources": {"listChanged": false, "subscribe": false},
        },
        "serverInfo": {"name": "wuhu", "title": "Wuhu", "version": server_version},
        "instructions": "Wuhu runs LLM agent sessions. Create one (session_create), send it a message (session_send), wait for its reply (session_wait), read its transcript (session_read). Every tool acts as the API does for your credentials.",
    })
}

/// A JSON-RPC result message.
pub fn result_message(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC error message (`id` null for a message that could not be read).
pub fn error_message(id: Option<&Value>, error: &RpcError) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id.cloned().unwrap_or(Value::Null),
        "error": {"code": error.code, "message": error.message},
    })
}

const ID: &str = r#"{"type":"string","description":"The session's id."}"#;

/// The tools, as `tools/list` answers (one page: there are few).
pub fn tools() -> Value {
    let id: Value = serde_json::from_str(ID).unwrap_or_default();
    let providers: Vec<&str> = crate::llm::PROVIDERS.to_vec();
    json!({"tools": [
        tool("sessions_list", "List the sessions you can see, newest first (GET /v1/sessions).",
            json!({"limit": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50}}), &[], true),
        tool("session_create", "Create a session (POST /v1/sessions). It starts with no environment.",
            json!({
                "title": {"type": "string", "maxLength": 200},
                "provider": {"type": "string", "enum": providers},
                "model": {"type": "string"},
                "access": {"type": "string", "enum": ["private", "tenant"], "description": "`tenant`: every member may read and prompt it."},
            }), &[], false),
        tool("session_send", "Queue a message in a session (POST /v1/sessions/{id}/enqueue); the agent answers it in a turn. Use session_wait for the reply.",
            json!({
                "id": id,
                "content": {"type": "string", "minLength": 1},
                "lane": {"type": "string", "enum": ["followUp", "steer"], "default": "followUp", "description": "`steer`: at the next step boundary of a running turn."},
            }), &["id", "content"], false),
        tool("session_wait", "Wait until a session is idle with nothing queued (at most timeoutSeconds); returns its status and the last assistant text.",
            json!({
                "id": id,
                "timeoutSeconds": {"type": "integer", "minimum": 1, "maximum": MAX_WAIT_SECONDS, "default": 30},
            }), &["id"], true),
        tool("session_read", "Read a session and a page of its transcript (GET /v1/sessions/{id}).",
            json!({
                "id": id,
                "sinceCursor": {"type": "integer", "minimum": 0, "description": "Only entries after this cursor."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_READ_ENTRIES, "default": 50},
            }), &["id"], true),
        tool("session_stop", "Stop a session's turn (POST /v1/sessions/{id}/stop).",
            json!({"id": id}), &["id"], false),
        tool("approvals_list", "The approvals a session is waiting for (from its transcript).",
            json!({"id": id}), &["id"], true),
        tool("approval_answer", "Answer an approval (POST /v1/sessions/{id}/approvals/{approvalId}).",
            json!({
                "id": id,
                "approvalId": {"type": "string"},
                "decision": {"type": "string", "enum": ["approve", "approve_session", "deny"]},
            }), &["id", "approvalId", "decision"], false),
        tool("workspace_read", "Read a document of the tenant's workspace (GET /v1/workspace/docs/{path}).",
            json!({"path": {"type": "string", "description": "Such as notes/plan.md."}}), &["path"], true),
        tool("workspace_write", "Write a document of the tenant's workspace (PUT /v1/workspace/docs/{path}).",
            json!({"path": {"type": "string"}, "content": {"type": "string"}}), &["path", "content"], false),
    ]})
}

fn tool(
    name: &str,
    description: &str,
    properties: Value,
    required: &[&str],
    read_only: bool,
) -> Value {
    json!({
        "name": name,
        "description": description,
        "inputSchema": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        },
        "annotations": {"readOnlyHint": read_only, "openWorldHint": false},
    })
}

/// One API request a tool makes, as the caller.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpCall {
    /// `GET`, `POST`, `PUT`.
    pub method: &'static str,
    /// The path and query, segments percent-encoded (`/v1/sessions/<id>?limit=50`).
    pub path: String,
    /// The body.
    pub body: Option<CallBody>,
}

/// A request body.
#[derive(Clone, Debug, PartialEq)]
pub enum CallBody {
    /// JSON (`application/json`).
    Json(Value),
    /// Text as it is (a workspace document).
    Text(String),
}

/// What a `tools/call` does.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// One API request; its answer is the result.
    Http(HttpCall),
    /// Poll `GET /v1/sessions/<id>?limit=1` until idle with nothing queued, or the time is up;
    /// then read the tail for the last assistant text ([`wait_result`]).
    Wait {
        /// The session.
        id: String,
        /// Seconds at most.
        timeout_secs: u64,
    },
    /// Read the session's transcript and answer its pending approvals ([`pending_approvals`]).
    Approvals {
        /// The session.
        id: String,
    },
}

/// A `tools/call`'s params into what to do.
///
/// # Errors
/// [`codes::INVALID_PARAMS`]: an unknown tool, a missing or ill-typed argument, an unknown
/// argument.
pub fn plan(params: &Value) -> Result<Plan, RpcError> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, "\"name\" (the tool) is required"))?;
    let empty = Map::new();
    let args = match params.get("arguments") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(RpcError::new(
                codes::INVALID_PARAMS,
                "\"arguments\" must be an object",
            ));
        }
    };
    let a = Args { tool: name, args };
    let plan = match name {
        "sessions_list" => {
            a.only(&["limit"])?;
            let limit = a.int("limit", 1, 200)?.unwrap_or(50);
            get(format!("/v1/sessions?limit={limit}"))
        }
        "session_create" => {
            a.only(&["title", "provider", "model", "access"])?;
            let mut body = Map::new();
            for key in ["title", "provider", "model", "access"] {
                if let Some(text) = a.text(key)? {
                    body.insert(key.into(), text.into());
                }
            }
            Plan::Http(HttpCall {
                method: "POST",
                path: "/v1/sessions".into(),
                body: Some(CallBody::Json(Value::Object(body))),
            })
        }
        "session_send" => {
            a.only(&["id", "content", "lane"])?;
            let id = a.session_id()?;
            let content = a.required_text("content")?;
            let lane = a.text("lane")?.unwrap_or_else(|| "followUp".into());
            if lane != "followUp" && lane != "steer" {
                return Err(a.bad("lane must be followUp or steer"));
            }
            Plan::Http(HttpCall {
                method: "POST",
                path: format!("/v1/sessions/{id}/enqueue?lane={lane}"),
                body: Some(CallBody::Json(json!({"content": content}))),
            })
        }
        "session_wait" => {
            a.only(&["id", "timeoutSeconds"])?;
            Plan::Wait {
                id: a.session_id()?,
                timeout_secs: a.int("timeoutSeconds", 1, MAX_WAIT_SECONDS)?.unwrap_or(30),
            }
        }
        "session_read" => {
            a.only(&["id", "sinceCursor", "limit"])?;
            let id = a.session_id()?;
            let limit = a.int("limit", 1, MAX_READ_ENTRIES)?.unwrap_or(50);
            let mut path = format!("/v1/sessions/{id}?limit={limit}");
            if let Some(since) = a.int("sinceCursor", 0, u64::MAX >> 11)? {
                path.push_str(&format!("&sinceCursor={since}"));
            }
            get(path)
        }
        "session_stop" => {
            a.only(&["id"])?;
            let id = a.session_id()?;
            Plan::Http(HttpCall {
                method: "POST",
                path: format!("/v1/sessions/{id}/stop"),
                body: Some(CallBody::Json(json!({}))),
            })
        }
        "approvals_list" => {
            a.only(&["id"])?;
            Plan::Approvals {
                id: a.session_id()?,
            }
        }
        "approval_answer" => {
            a.only(&["id", "approvalId", "decision"])?;
            let id = a.session_id()?;
            let approval = a.required_text("approvalId")?;
            if !crate::deletion::is_session_id(&approval) {
                return Err(a.bad("approvalId is an approval's id (a UUID)"));
            }
            let decision = a.required_text("decision")?;
            if crate::approvals::Answer::parse(&decision).is_none() {
                return Err(a.bad("decision must be approve, approve_session or deny"));
            }
            Plan::Http(HttpCall {
                method: "POST",
                path: format!("/v1/sessions/{id}/approvals/{approval}"),
                body: Some(CallBody::Json(json!({"decision": decision}))),
            })
        }
        "workspace_read" => {
            a.only(&["path"])?;
            get(format!("/v1/workspace/docs/{}", a.doc_path()?))
        }
        "workspace_write" => {
            a.only(&["path", "content"])?;
            let path = a.doc_path()?;
            let content = a
                .args
                .get("content")
                .and_then(Value::as_str)
                .ok_or_else(|| a.bad("content (a string) is required"))?;
            Plan::Http(HttpCall {
                method: "PUT",
                path: format!("/v1/workspace/docs/{path}"),
                body: Some(CallBody::Text(content.to_string())),
            })
        }
        _ => {
            return Err(RpcError::new(
                codes::INVALID_PARAMS,
                format!("unknown tool {name:?} (tools/list names them)"),
            ));
        }
    };
    Ok(plan)
}

/// Sessions `resources/list` shows a page.
pub const RESOURCES_PER_PAGE: u64 = 50;

/// A session as a resource.
pub fn session_uri(id: &str) -> String {
    format!("wuhu://session/{id}")
}

/// `resources/list`: the sessions the caller sees, newest first, a page per cursor (the
/// workspace's documents are the template `wuhu://workspace/{path}`).
///
/// # Errors
/// [`codes::INVALID_PARAMS`] for a cursor this server did not give.
pub fn resources_list_call(params: &Value) -> Result<HttpCall, RpcError> {
    let mut path = format!("/v1/sessions?limit={RESOURCES_PER_PAGE}");
    match params.get("cursor") {
        None | Some(Value::Null) => {}
        Some(Value::String(cursor)) if crate::deletion::is_session_id(cursor) => {
            path.push_str(&format!("&before={cursor}"));
        }
        Some(_) => {
            return Err(RpcError::new(
                codes::INVALID_PARAMS,
                "cursor is one a previous resources/list answered",
            ));
        }
    }
    Ok(HttpCall {
        method: "GET",
        path,
        body: None,
    })
}

/// The `resources/list` result of a `GET /v1/sessions` page.
pub fn resources_list_result(page: &Value) -> Value {
    let resources: Vec<Value> = page["sessions"]
        .as_array()
        .map(|sessions| {
            sessions
                .iter()
                .filter_map(|s| {
                    let id = s["id"].as_str()?;
                    let title = s["title"].as_str().unwrap_or("(untitled)");
                    Some(json!({
                        "uri": session_uri(id),
                        "name": title,
                        "description": format!(
                            "A Wuhu session ({}, {}), owned by {}",
                            s["status"].as_str().unwrap_or("unknown"),
                            s["model"].as_str().unwrap_or(""),
                            s["owner"].as_str().unwrap_or("")
                        ),
                        "mimeType": "application/json",
                    }))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut result = json!({"resources": resources});
    if let Some(next) = page["nextBefore"].as_str() {
        result["nextCursor"] = json!(next);
    }
    result
}

/// `resources/templates/list`.
pub fn resource_templates() -> Value {
    json!({"resourceTemplates": [
        {"uriTemplate": "wuhu://session/{id}", "name": "session",
         "description": "A session and the last 200 entries of its transcript", "mimeType": "application/json"},
        {"uriTemplate": "wuhu://workspace/{path}", "name": "workspace document",
         "description": "A document of the tenant's workspace (such as notes/plan.md)", "mimeType": "text/markdown"},
    ]})
}

/// `resources/read`: the API request for the resource `params.uri`.
///
/// # Errors
/// [`codes::INVALID_PARAMS`]: no URI, or not one of this server's.
pub fn resource_read_call(params: &Value) -> Result<HttpCall, RpcError> {
    let uri = params
        .get("uri")
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::new(codes::INVALID_PARAMS, "uri (a string) is required"))?;
    let bad = || {
        RpcError::new(
            codes::INVALID_PARAMS,
            format!(
                "{uri:?} is not a resource of this server (wuhu://session/<id>, wuhu://workspace/<path>)"
            ),
        )
    };
    let path = if let Some(id) = uri.strip_prefix("wuhu://session/") {
        if !crate::deletion::is_session_id(id) {
            return Err(bad());
        }
        format!("/v1/sessions/{id}?limit={MAX_READ_ENTRIES}")
    } else if let Some(doc) = uri.strip_prefix("wuhu://workspace/") {
        let args = Map::from_iter([("path".to_string(), json!(doc))]);
        let a = Args {
            tool: "resources/read",
            args: &args,
        };
        format!("/v1/workspace/docs/{}", a.doc_path().map_err(|_| bad())?)
    } else {
        return Err(bad());
    };
    Ok(HttpCall {
        method: "GET",
        path,
        body: None,
    })
}

/// The `resources/read` result of the API's answer.
///
/// # Errors
/// [`codes::RESOURCE_NOT_FOUND`] for a `404` (what the caller may not read is not found
/// either), [`codes::INTERNAL_ERROR`] for another failure.
pub fn resource_read_result(uri: &str, status: u16, body: &Value) -> Result<Value, RpcError> {
    if status == 404 {
        return Err(RpcError::new(
            codes::RESOURCE_NOT_FOUND,
            format!("Resource not found: {uri}"),
        ));
    }
    if !(200..300).contains(&status) {
        return Err(RpcError::new(
            codes::INTERNAL_ERROR,
            format!(
                "{status} {}",
                body.pointer("/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("the request failed")
            ),
        ));
    }
    let (mime, text) = match body.get("content").and_then(Value::as_str) {
        Some(doc) if uri.starts_with("wuhu://workspace/") => ("text/markdown", doc.to_string()),
        _ => (
            "application/json",
            serde_json::to_string_pretty(body).unwrap_or_default(),
        ),
    };
    Ok(json!({"contents": [{"uri": uri, "mimeType": mime, "text": text}]}))
}

fn get(path: String) -> Plan {
    Plan::Http(HttpCall {
        method: "GET",
        path,
        body: None,
    })
}

struct Args<'a> {
    tool: &'a str,
    args: &'a Map<String, Value>,
}

impl Args<'_> {
    fn bad(&self, what: impl std::fmt::Display) -> RpcError {
        RpcError::new(codes::INVALID_PARAMS, format!("{}: {what}", self.tool))
    }

    fn only(&self, known: &[&str]) -> Result<(), RpcError> {
        match self.args.keys().find(|k| !known.contains(&k.as_str())) {
            Some(unknown) => Err(self.bad(format!(
                "unknown argument {unknown:?} (it takes {})",
                known.join(", ")
            ))),
            None => Ok(()),
        }
    }

    fn text(&self, key: &str) -> Result<Option<String>, RpcError> {
        match self.args.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.bad(format!("{key} must be a string"))),
        }
    }

    fn required_text(&self, key: &str) -> Result<String, RpcError> {
        self.text(key)?
            .filter(|s| !s.trim().is_empty())
            .ok_or_else(|| self.bad(format!("{key} (a non-empty string) is required")))
    }

    fn int(&self, key: &str, min: u64, max: u64) -> Result<Option<u64>, RpcError> {
        match self.args.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|n| (min..=max).contains(n))
                .map(Some)
                .ok_or_else(|| self.bad(format!("{key} must be an integer from {min} to {max}"))),
        }
    }

    /// A session id: only a UUID goes into a path.
    fn session_id(&self) -> Result<String, RpcError> {
        let id = self.required_text("id")?;
        if !crate::deletion::is_session_id(&id) {
            return Err(self.bad("id is a session's id (a UUID)"));
        }
        Ok(id)
    }

    /// A workspace document's path, checked by the workspace's rules and percent-encoded
    /// segment by segment.
    fn doc_path(&self) -> Result<String, RpcError> {
        let path = self.required_text("path")?;
        let normal = crate::workspace::normalize_doc_path(&path).map_err(|e| self.bad(e))?;
        let mut url = url::Url::parse("http://wuhu.invalid/").map_err(|e| self.bad(e))?;
        url.path_segments_mut()
            .map_err(|()| self.bad("path"))?
            .extend(normal.split('/'));
        Ok(url.path().trim_start_matches('/').to_string())
    }
}

/// The result of an API answer: its JSON as text (cut at [`MAX_RESULT_TEXT_CHARS`]) and as
/// structured content; a 4xx or 5xx is a result with `isError` naming the status, code and
/// message.
pub fn http_result(status: u16, body: &Value) -> Value {
    if !(200..300).contains(&status) {
        let code = body
            .pointer("/error/code")
            .and_then(Value::as_str)
            .unwrap_or("error");
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("the request failed");
        return json!({
            "content": [{"type": "text", "text": format!("{status} {code}: {message}")}],
            "isError": true,
        });
    }
    let structured = match body {
        Value::Object(_) => body.clone(),
        Value::Null => json!({"ok": true}),
        other => json!({"value": other}),
    };
    let text = serde_json::to_string_pretty(&structured).unwrap_or_default();
    json!({
        "content": [{"type": "text", "text": cut(&text)}],
        "structuredContent": structured,
        "isError": false,
    })
}

fn cut(text: &str) -> String {
    match text.char_indices().nth(MAX_RESULT_TEXT_CHARS) {
        Some((at, _)) => format!(
            "{}\n… (cut at {MAX_RESULT_TEXT_CHARS} characters; the structured content is whole)",
            &text[..at]
        ),
        None => text.to_string(),
    }
}

/// Whether `GET /v1/sessions/<id>` shows a session at rest: not running, nothing queued.
pub fn at_rest(session: &Value) -> bool {
    session.pointer("/session/status").and_then(Value::as_str) != Some("running")
        && session
            .get("queue")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

/// The entries to read for the last assistant text: from cursor `last - 20`.
pub fn tail_cursor(session: &Value) -> u64 {
    session
        .pointer("/session/lastCursor")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .saturating_sub(20)
}

/// `session_wait`'s result: the status, whether it came to rest in time, the last assistant
/// text among `tail` (entries of the session's end), the last cursor.
pub fn wait_result(session: &Value, tail: &[Entry], settled: bool) -> Value {
    let final_text = tail.iter().rev().find_map(|entry| match &entry.payload {
        EntryPayload::Message {
            message: Message::Assistant(a),
        } => {
            let text = a.text();
            (!text.trim().is_empty()).then_some(text)
        }
        _ => None,
    });
    let structured = json!({
        "status": session.pointer("/session/status").cloned().unwrap_or(Value::Null),
        "settled": settled,
        "lastCursor": session.pointer("/session/lastCursor").cloned().unwrap_or(Value::Null),
        "finalText": final_text,
    });
    let text = match (settled, &final_text) {
        (false, _) => "still working when the wait ended; call session_wait again".to_string(),
        (true, Some(text)) => cut(text),
        (true, None) => "the session is at rest; its last turn has no text".to_string(),
    };
    json!({
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": false,
    })
}

/// `approvals_list`'s result: the pending approval requests of `entries`.
pub fn pending_approvals(entries: &[Entry]) -> Value {
    let pending: Vec<Value> = crate::approvals::pending_requests(entries)
        .into_iter()
        .cloned()
        .collect();
    let structured = json!({"approvals": pending});
    json!({
        "content": [{"type": "text", "text": serde_json::to_string_pretty(&structured).unwrap_or_default()}],
        "structuredContent": structured,
        "isError": false,
    })
}

pub mod progress;

#[cfg(test)]
mod tests;
