//! The built-in tools, run inside the session actor. Each call gets a complete
//! [`ToolContext`]; tools never reach back into the session (decision 0003).

use serde::Deserialize;
use wuhu_core::images;
use wuhu_core::tools::{names, page_lines, truncate_head};
use wuhu_core::wire::{
    BlobRef, ContentBlock, Entry, EntryPayload, GetSessionResponse, Message, ToolCall,
};
use wuhu_core::workspace::{WuhuUrl, parse_wuhu_url};

use crate::blob_store::BlobContent;
use crate::tool_context::{ToolContext, ToolOutput};
use crate::{session_client, tenant_index, workspace_io};

fn parse_args<T: for<'de> Deserialize<'de>>(call: &ToolCall) -> Result<T, String> {
    serde_json::from_value(call.arguments.clone())
        .map_err(|e| format!("Invalid arguments for {}: {e}", call.name))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    limit: Option<u32>,
    before: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadFileArgs {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
    #[allow(dead_code)]
    environment: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteFileArgs {
    path: String,
    content: String,
    #[allow(dead_code)]
    environment: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReadArgs {
    id: String,
    since_cursor: Option<u64>,
}

/// Runs one tool call; an error result is a tool error the model sees.
pub(crate) async fn execute(context: &ToolContext, call: &ToolCall) -> ToolOutput {
    let mut attached = Vec::new();
    let result = execute_text(context, call, &mut attached).await;
    ToolOutput::with_blobs(result, attached)
}

/// Runs one tool call; blobs the result refers to (an image `read` of a blob) go to `attached`.
async fn execute_text(
    context: &ToolContext,
    call: &ToolCall,
    attached: &mut Vec<BlobRef>,
) -> Result<String, String> {
    match call.name.as_str() {
        names::LIST_SESSIONS => {
            let args: ListArgs = parse_args(call)?;
            let limit = args.limit.unwrap_or(20).clamp(1, 100);
            let page = tenant_index::list_for(
                &context.env,
                &context.session.tenant,
                context.readers(),
                limit,
                args.before.as_deref(),
            )
            .await
            .map_err(|e| format!("Listing sessions failed: {}", e.message))?;
            let mut out = String::new();
            for s in &page.sessions {
                let marker = if s.id == context.session.session_id {
                    " (this session)"
                } else {
                    ""
                };
                out.push_str(&format!(
                    "{} · {} · {} · updated {}{}\n",
                    s.id,
                    s.title.as_deref().unwrap_or("(untitled)"),
                    s.status.as_str(),
                    s.updated_at,
                    marker
                ));
            }
            if out.is_empty() {
                out.push_str("No sessions.\n");
            }
            if let Some(next) = page.next_before {
                out.push_str(&format!(
                    "[more sessions: call list_sessions with before={next:?}]\n"
                ));
            }
            Ok(out)
        }
        names::READ_SESSION => {
            let args: ReadArgs = parse_args(call)?;
            let since = args.since_cursor.unwrap_or(0);
            let page: GetSessionResponse = session_client::read_for(
                &context.env,
                &context.session.tenant,
                context.readers(),
                &args.id,
                since,
                500,
            )
            .await
            .map_err(|e| {
                if e.status == 404 {
                    format!("No session {:?} in this workspace.", args.id)
                } else {
                    format!("Reading the session failed: {}", e.message)
                }
            })?;
            let mut text = String::new();
            let mut last_cursor = since;
            let mut cursors = Vec::new();
            for entry in &page.transcript {
                let line = render_entry(entry);
                cursors.push((text.len(), entry.cursor));
                text.push_str(&line);
                last_cursor = entry.cursor;
            }
            let cut = truncate_head(&text);
            let mut out = cut.text.clone();
            let continue_at = if cut.truncated {
                // Continue after the last entry that was shown whole.
                cursors
                    .iter()
                    .take_while(|(offset, _)| *offset < cut.text.len())
                    .last()
                    .map(|(_, c)| c.saturating_sub(1))
                    .or(Some(since))
            } else {
                page.next_cursor.map(|_| last_cursor)
            };
            if let Some(next) = continue_at {
                out.push_str(&format!("\n[transcript continues: call read_session with id={:?} and sinceCursor={next}]\n", args.id));
            }
            if out.is_empty() {
                out.push_str("No entries after that cursor.\n");
            }
            Ok(out)
        }
        names::READ => {
            let args: ReadFileArgs = parse_args(call)?;
            match parse_wuhu_url(&args.path) {
                // Plain paths and wuhu://env/ go to the environment tools (see `run`).
                None | Some(Ok(WuhuUrl::Env { .. })) => {
                    Err("this path needs an environment".into())
                }
                Some(Err(e)) => Err(e.to_string()),
                Some(Ok(WuhuUrl::Blob(id))) => {
                    match crate::blob_store::read_blob(
                        &context.env,
                        &context.session.tenant,
                        &context.session.session_id,
                        &id,
                    )
                    .await?
                    {
                        BlobContent::Text(text) => {
                            Ok(page_lines(&text, args.offset.unwrap_or(1), args.limit))
                        }
                        // As `read` of an image file on a runner: the text says what and where,
                        // the reference attaches the image.
                        BlobContent::Image(blob) => {
                            let text = images::describe(
                                &blob.uri,
                                &blob.uri,
                                &blob.media_type,
                                blob.size,
                                blob.width,
                                blob.height,
                            );
                            attached.push(blob);
                            Ok(text)
                        }
                    }
                }
                Some(Ok(WuhuUrl::Mcp { server, uri })) => {
                    let text =
                        crate::mcp_client::read_resource(context, &server, &uri, attached).await?;
                    Ok(page_lines(&text, args.offset.unwrap_or(1), args.limit))
                }
                Some(Ok(WuhuUrl::Config(_))) if !context.rights.may_read_config() => Err(
                    "Refused: this turn acts for a chat guest, who may not read the tenant's settings."
                        .to_string(),
                ),
                Some(Ok(WuhuUrl::Config(path))) => {
                    let text = crate::workspace_io::config_doc(&context.env, &context.session.tenant, &path)
                        .await?
                        .ok_or_else(|| {
                            format!(
                                "No config document {path:?}. Available: wuhu://config/server.json, wuhu://config/models.json"
                            )
                        })?;
                    Ok(page_lines(&text, args.offset.unwrap_or(1), args.limit))
                }
                Some(Ok(WuhuUrl::Workspace(path))) if path.is_empty() || path.ends_with('/') => {
                    context.rights.may_read_workspace(&path)?;
                    let page = workspace_io::list(&context.env, &context.session.tenant, &path, 1000, None)
                        .await
                        .map_err(|e| e.message)?;
                    let mut text: String = page
                        .docs
                        .iter()
                        .map(|d| format!("wuhu://workspace/{} ({} bytes)\n", d.path, d.size))
                        .collect();
                    if text.is_empty() {
                        text = format!("No documents under wuhu://workspace/{path}\n");
                    }
                    Ok(page_lines(&text, args.offset.unwrap_or(1), args.limit))
                }
                Some(Ok(WuhuUrl::Workspace(path))) => {
                    context.rights.may_read_workspace(&path)?;
                    let doc = workspace_io::read(&context.env, &context.session.tenant, &path)
                        .await
                        .map_err(|e| e.message)?
                        .ok_or_else(|| format!("No document at wuhu://workspace/{path}"))?;
                    Ok(page_lines(
                        &doc.content,
                        args.offset.unwrap_or(1),
                        args.limit,
                    ))
                }
            }
        }
        names::WRITE => {
            let args: WriteFileArgs = parse_args(call)?;
            match parse_wuhu_url(&args.path) {
                // Plain paths and wuhu://env/ go to the environment tools (see `run`).
                None | Some(Ok(WuhuUrl::Env { .. })) => {
                    Err("this path needs an environment".into())
                }
                Some(Err(e)) => Err(e.to_string()),
                Some(Ok(WuhuUrl::Config(_))) => Err("wuhu://config/ is read-only.".to_string()),
                Some(Ok(WuhuUrl::Blob(_))) => Err("wuhu://blob/ is read-only.".to_string()),
                Some(Ok(WuhuUrl::Mcp { .. })) => Err(
                    "wuhu://mcp/ is read-only: change things through the server's tools (mcp_call)."
                        .to_string(),
                ),
                Some(Ok(WuhuUrl::Workspace(path))) => {
                    let summary = workspace_io::write(
                        &context.env,
                        &context.session.tenant,
                        &context.workspace_writer(),
                        &path,
                        &args.content,
                    )
                    .await
                    .map_err(|e| e.message)?;
                    Ok(format!(
                        "Wrote wuhu://workspace/{} ({} bytes, version {}).",
                        summary.path, summary.size, summary.version
                    ))
                }
            }
        }
        names::JS => crate::js_tool::run(context, &call.arguments).await,
        other => Err(format!("Tool {other:?} is not available here.")),
    }
}

fn render_entry(entry: &Entry) -> String {
    let body = match &entry.payload {
        EntryPayload::Header(h) => format!("[header] model {} ({})", h.model, h.provider),
        EntryPayload::Custom { custom_type, data } => format!("[notice {custom_type}] {data}"),
        EntryPayload::Compaction(c) => format!(
            "[compaction, entries from {} kept] {}",
            c.first_kept_cursor, c.summary
        ),
        EntryPayload::Message { message } => match message {
            Message::User {
                author, content, ..
            } => format!("[user {author}] {content}"),
            Message::CustomMessage { content, .. } => format!("[system] {content}"),
            Message::ToolResult(r) => format!(
                "[tool_result {}{}] {}",
                r.tool_name,
                if r.is_error { " error" } else { "" },
                r.content
            ),
            Message::Assistant(a) => {
                let mut parts = Vec::new();
                for block in &a.content {
                    match block {
                        ContentBlock::Text { text } => parts.push(text.clone()),
                        ContentBlock::ToolCall(c) => {
                            parts.push(format!("<call {} {}>", c.name, c.arguments))
                        }
                        // Reasoning is the model's private scratchpad: not quoted to others.
                        ContentBlock::Thinking { .. }
                        | ContentBlock::RedactedThinking { .. }
                        | ContentBlock::Reasoning { .. } => {}
                    }
                }
                format!("[assistant] {}", parts.join(" "))
            }
        },
    };
    format!("#{} {}\n", entry.cursor, body)
}
