//! What the model sees of MCP: the tool listings of `mcp_tools`, and a `tools/call` result as
//! a tool result (text, with images and large resources stored as blobs).

use serde_json::{Value, json};

use super::config::{Server, Source};
use super::exchange::McpError;

/// The most tools read from one server (over at most [`MAX_LIST_PAGES`] pages).
pub const MAX_TOOLS: usize = 1_000;
/// The most `tools/list` pages read from one server.
pub const MAX_LIST_PAGES: usize = 20;
/// The most tools one `mcp_tools` result shows (the rest: `offset`).
pub const TOOLS_PER_PAGE: usize = 25;
/// The longest input schema shown whole (bytes of compact JSON); a longer one is cut, and
/// `mcp_tools` with the tool's exact name as `query` shows it whole.
pub const MAX_SCHEMA_BYTES: usize = 4 * 1024;
/// The longest tool description shown, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 1_000;
/// An embedded text resource up to this many bytes is shown inline; a longer one is stored as
/// a blob (its head is shown).
pub const MAX_INLINE_RESOURCE_BYTES: usize = 16 * 1024;

/// One tool a server offers.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// Its arguments' JSON Schema.
    pub input_schema: Value,
}

/// The params of a `tools/list` request.
pub fn list_params(cursor: Option<&str>) -> Value {
    match cursor {
        Some(cursor) => json!({"cursor": cursor}),
        None => Value::Null,
    }
}

/// The tools of one `tools/list` page and the cursor of the next.
///
/// # Errors
/// [`McpError::Malformed`] for a page without a `tools` list.
pub fn tools_page(result: &Value) -> Result<(Vec<ToolInfo>, Option<String>), McpError> {
    let tools = result
        .get("tools")
        .and_then(Value::as_array)
        .ok_or_else(|| McpError::Malformed("tools/list answered without a tools list".into()))?;
    let tools = tools
        .iter()
        .filter_map(|tool| {
            let name = tool.get("name")?.as_str()?.to_string();
            let description = tool
                .get("description")
                .and_then(Value::as_str)
                .or_else(|| tool.get("title").and_then(Value::as_str))
                .unwrap_or("")
                .to_string();
            Some(ToolInfo {
                name,
                description,
                input_schema: tool
                    .get("inputSchema")
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object"})),
            })
        })
        .collect();
    let next = result
        .get("nextCursor")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    Ok((tools, next))
}

fn whose(source: &Source) -> String {
    match source {
        Source::Tenant => "the tenant's".into(),
        Source::User(sub) => format!("{sub}'s own"),
        Source::Environment(environment) => format!("in environment {environment:?}"),
    }
}

/// `mcp_tools` without a server: the servers the turn sees, and those it does not and why.
pub fn render_servers(seen: &[&Server], shadowed: &[&Server], user_note: Option<&str>) -> String {
    let mut out = String::new();
    if seen.is_empty() {
        out.push_str("No MCP servers are configured for this turn (admins list the tenant's in wuhu://workspace/config/mcp.json; each user their own in wuhu://workspace/users/<user>/mcp.json).\n");
    } else {
        out.push_str("MCP servers (call mcp_tools with server=<name> to see a server's tools):\n");
        for server in seen {
            out.push_str(&format!(
                "- {} ({}; {}{})\n",
                server.doc.name,
                whose(&server.source),
                server.location(),
                if server.doc.approval == super::config::Approval::Ask {
                    "; each call waits for approval"
                } else {
                    ""
                }
            ));
        }
    }
    for server in shadowed {
        out.push_str(&format!(
            "(not offered: {} {:?}, whose name the tenant's server takes)\n",
            whose(&server.source),
            server.doc.name
        ));
    }
    if let Some(note) = user_note {
        out.push_str(note);
        out.push('\n');
    }
    out
}

/// Whether `tool` is found by `query` (a case-insensitive part of its name or description).
pub fn finds(tool: &ToolInfo, query: Option<&str>) -> bool {
    let Some(query) = query.map(str::trim).filter(|q| !q.is_empty()) else {
        return true;
    };
    let query = query.to_lowercase();
    tool.name.to_lowercase().contains(&query) || tool.description.to_lowercase().contains(&query)
}

/// `mcp_tools` of one server: the tools it offers (those the document's `tools` filter lets
/// through and `query` finds), [`TOOLS_PER_PAGE`] from `offset`, each with its schema.
/// `more_on_server` says the server had more tools than were read.
pub fn render_tools(
    server: &Server,
    tools: &[ToolInfo],
    query: Option<&str>,
    offset: usize,
    more_on_server: bool,
) -> String {
    let offered: Vec<&ToolInfo> = tools
        .iter()
        .filter(|t| server.offers(&t.name) && finds(t, query))
        .collect();
    let exact = query.is_some_and(|q| offered.iter().any(|t| t.name == q.trim()));
    let mut out = String::new();
    if offered.is_empty() {
        out.push_str(&format!(
            "MCP server {:?} offers no tools{}.\n",
            server.doc.name,
            if query.is_some() { " that match" } else { "" }
        ));
    }
    for tool in offered.iter().skip(offset).take(TOOLS_PER_PAGE) {
        let description: String = tool
            .description
            .chars()
            .take(MAX_DESCRIPTION_CHARS)
            .collect();
        let schema = tool.input_schema.to_string();
        let schema = if schema.len() > MAX_SCHEMA_BYTES && !exact {
            let cut = schema.floor_char_boundary(MAX_SCHEMA_BYTES);
            format!(
                "{}… (cut: call mcp_tools with server={:?} query={:?} for the whole schema)",
                &schema[..cut],
                server.doc.name,
                tool.name
            )
        } else {
            schema
        };
        out.push_str(&format!(
            "## {}\n{}\narguments: {}\n\n",
            tool.name, description, schema
        ));
    }
    let shown_to = offset.saturating_add(TOOLS_PER_PAGE);
    if offered.len() > shown_to {
        out.push_str(&format!(
            "[{} more: call mcp_tools with server={:?}{} offset={shown_to}]\n",
            offered.len() - shown_to,
            server.doc.name,
            query.map(|q| format!(" query={q:?}")).unwrap_or_default()
        ));
    }
    if more_on_server {
        out.push_str(&format!(
            "[the server lists more than {MAX_TOOLS} tools; only the first were read]\n"
        ));
    }
    out.push_str(&format!(
        "Call one with mcp_call {{server: {:?}, tool, arguments}}.\n",
        server.doc.name
    ));
    out
}

/// The params of a `tools/call` request. `progress_token` asks the server for progress
/// notifications.
pub fn call_params(tool: &str, arguments: &Value, progress_token: Option<&str>) -> Value {
    let mut params = json!({"name": tool, "arguments": arguments});
    if let Some(token) = progress_token {
        params["_meta"] = json!({"progressToken": token});
    }
    params
}

/// A part of a call's result.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Text, shown as is.
    Text(String),
    /// Bytes to store as a blob; `label` says what they are (an image, a resource's URI).
    Store {
        /// What the server said it is.
        media_type: String,
        /// The content.
        bytes: Vec<u8>,
        /// What the text calls it.
        label: String,
    },
}

/// A `tools/call` (or `resources/read`) result, before its blobs are stored.
#[derive(Clone, Debug, PartialEq)]
pub struct ResultPlan {
    /// Whether the tool said it failed (`isError`).
    pub is_error: bool,
    /// Its parts, in order.
    pub parts: Vec<Part>,
}

/// Standard base64 (with or without padding, whitespace ignored), as MCP carries images and
/// binary resources.
fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let url: String = text
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .take_while(|c| *c != '=')
        .map(|c| match c {
            '+' => '-',
            '/' => '_',
            c => c,
        })
        .collect();
    crate::jwt::base64url_decode(&url).ok()
}

fn resource_part(resource: &Value, server: &str) -> Part {
    let uri = resource.get("uri").and_then(Value::as_str).unwrap_or("");
    let media_type = resource
        .get("mimeType")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if let Some(text) = resource.get("text").and_then(Value::as_str) {
        if text.len() <= MAX_INLINE_RESOURCE_BYTES {
            return Part::Text(format!("[resource {uri}]\n{text}"));
        }
        return Part::Store {
            media_type: if media_type.is_empty() {
                "text/plain".into()
            } else {
                media_type
            },
            bytes: text.as_bytes().to_vec(),
            label: format!("resource {uri}"),
        };
    }
    match resource
        .get("blob")
        .and_then(Value::as_str)
        .and_then(decode_base64)
    {
        Some(bytes) => Part::Store {
            media_type,
            bytes,
            label: format!("resource {uri}"),
        },
        None => Part::Text(format!(
            "[resource {uri}: neither text nor readable base64; read it with read wuhu://mcp/{server}/{uri}]"
        )),
    }
}

/// Plans a `tools/call` result of `server`.
///
/// # Errors
/// [`McpError::Malformed`] for a result without `content`.
pub fn plan_call_result(result: &Value, server: &str) -> Result<ResultPlan, McpError> {
    let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
    let content = result.get("content").and_then(Value::as_array);
    let structured = result.get("structuredContent");
    let Some(content) = content else {
        return match structured {
            Some(value) => Ok(ResultPlan {
                is_error,
                parts: vec![Part::Text(pretty(value))],
            }),
            None => Err(McpError::Malformed(
                "tools/call answered without content".into(),
            )),
        };
    };
    let mut parts = Vec::with_capacity(content.len());
    for block in content {
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let part = match kind {
            "text" => Part::Text(
                block
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            ),
            "image" | "audio" => {
                let media_type = block
                    .get("mimeType")
                    .and_then(Value::as_str)
                    .unwrap_or("application/octet-stream")
                    .to_string();
                match block
                    .get("data")
                    .and_then(Value::as_str)
                    .and_then(decode_base64)
                {
                    Some(bytes) => Part::Store {
                        media_type,
                        bytes,
                        label: kind.to_string(),
                    },
                    None => Part::Text(format!("[{kind}: its data is not base64]")),
                }
            }
            "resource" => resource_part(block.get("resource").unwrap_or(&Value::Null), server),
            "resource_link" => {
                let uri = block.get("uri").and_then(Value::as_str).unwrap_or("");
                let name = block.get("name").and_then(Value::as_str).unwrap_or("");
                Part::Text(format!(
                    "[resource {name}: read it with read wuhu://mcp/{server}/{uri}]"
                ))
            }
            other => Part::Text(format!("[content of type {other:?}, not shown]")),
        };
        parts.push(part);
    }
    if parts.is_empty()
        && let Some(value) = structured
    {
        parts.push(Part::Text(pretty(value)));
    }
    Ok(ResultPlan { is_error, parts })
}

/// Plans a `resources/read` result.
///
/// # Errors
/// [`McpError::Malformed`] for a result without `contents`.
pub fn plan_resource(result: &Value, server: &str) -> Result<ResultPlan, McpError> {
    let contents = result
        .get("contents")
        .and_then(Value::as_array)
        .ok_or_else(|| McpError::Malformed("resources/read answered without contents".into()))?;
    Ok(ResultPlan {
        is_error: false,
        parts: contents
            .iter()
            .map(|resource| resource_part(resource, server))
            .collect(),
    })
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_default()
}

/// How a stored part is shown: `stored` is the blob's URI and, for an image the model sees,
/// `true`; `Err` is why it was not stored.
pub type Stored = Result<(String, bool), String>;

/// The result's text, once its stored parts have their blobs (`stored`, one per
/// [`Part::Store`], in order).
pub fn render_result(plan: &ResultPlan, stored: &[Stored]) -> String {
    let mut stored = stored.iter();
    let mut out: Vec<String> = Vec::with_capacity(plan.parts.len());
    for part in &plan.parts {
        match part {
            Part::Text(text) => out.push(text.clone()),
            Part::Store {
                media_type,
                bytes,
                label,
            } => {
                let line = match stored.next() {
                    Some(Ok((uri, true))) => {
                        format!(
                            "[{label}: {media_type}, {} bytes, attached: {uri}]",
                            bytes.len()
                        )
                    }
                    Some(Ok((uri, false))) => {
                        let head = if media_type.starts_with("text/") || media_type.contains("json")
                        {
                            let end = bytes.len().min(crate::blobs::PREVIEW_BYTES);
                            let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
                            format!("\n{head}…")
                        } else {
                            String::new()
                        };
                        format!(
                            "[{label}: {media_type}, {} bytes, stored as {uri} (read it with read)]{head}",
                            bytes.len()
                        )
                    }
                    Some(Err(why)) => format!(
                        "[{label}: {media_type}, {} bytes, not kept: {why}]",
                        bytes.len()
                    ),
                    None => format!("[{label}: not kept]"),
                };
                out.push(line);
            }
        }
    }
    let text = out.join("\n");
    if text.is_empty() {
        "(the tool returned no content)".into()
    } else {
        text
    }
}

/// A failure as the agent sees it: the server named.
pub fn error_text(server: &str, what: &str, error: &McpError) -> String {
    format!("MCP server {server:?}: {what}: {error}")
}
