//! The tool catalogue the LLM sees, and output truncation shared by every tool.
//!
//! Tools are executed by hosts; this module only says what exists, how calls may be
//! scheduled, and how long output is cut.

use serde_json::json;

use crate::llm::ToolSchema;

/// How a tool may be scheduled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolTraits {
    /// May run concurrently with neighbouring parallel-safe calls of the same step.
    pub parallel_safe: bool,
    /// Running it twice is harmless, so a call interrupted by a restart is run again;
    /// otherwise it gets a "result lost" error.
    pub idempotent: bool,
}

/// Names of the built-in tools.
pub mod names;

/// The tools that act on background jobs (`bash {background: true}`), on the job's runner.
pub const JOB_TOOLS: [&str; 2] = [names::JOB_STATUS, names::JOB_KILL];

/// The tools that act on child sessions: a session at the maximum depth is not offered them
/// (`crate::orchestration::may_spawn`).
pub const SPAWN_TOOLS: [&str; 4] = [
    names::SPAWN_SESSION,
    names::SEND_TO_SESSION,
    names::WAIT_SESSIONS,
    names::STOP_SESSION,
];

/// Tools that run on a runner, in an attached environment (`read`/`write` too, for plain paths
/// and `wuhu://env/` URLs).
pub const ENVIRONMENT_TOOLS: [&str; 5] = [
    names::BASH,
    names::EDIT,
    names::LS,
    names::FIND,
    names::GREP,
];

/// The traits of a known tool, or `None` for a name the model made up.
pub fn traits(name: &str) -> Option<ToolTraits> {
    match name {
        names::LIST_SESSIONS | names::READ_SESSION | names::READ | names::MCP_TOOLS => {
            Some(ToolTraits {
                parallel_safe: true,
                idempotent: true,
            })
        }
        // Writing the same content twice is harmless; writes to one place must not race.
        names::WRITE => Some(ToolTraits {
            parallel_safe: false,
            idempotent: true,
        }),
        names::LS | names::FIND | names::GREP => Some(ToolTraits {
            parallel_safe: true,
            idempotent: true,
        }),
        // Side effects: never run twice, never concurrently.
        names::BASH | names::EDIT | names::REQUEST_ENVIRONMENT | names::DETACH_ENVIRONMENT => {
            Some(ToolTraits {
                parallel_safe: false,
                idempotent: false,
            })
        }
        // Children are independent: spawns of one step run together. A spawn or a message
        // repeated after a restart would act twice.
        names::SPAWN_SESSION | names::SEND_TO_SESSION => Some(ToolTraits {
            parallel_safe: true,
            idempotent: false,
        }),
        // Waiting again, or stopping what is stopped, changes nothing.
        names::WAIT_SESSIONS | names::STOP_SESSION => Some(ToolTraits {
            parallel_safe: true,
            idempotent: true,
        }),
        // Asking again, or killing what is dead, changes nothing.
        names::JOB_STATUS | names::JOB_KILL => Some(ToolTraits {
            parallel_safe: true,
            idempotent: true,
        }),
        // A script may have side effects (fetch, writes): never run twice, never concurrently.
        // Switching to the model it already uses changes nothing.
        names::SET_MODEL => Some(ToolTraits {
            parallel_safe: false,
            idempotent: true,
        }),
        // Another system's tool: nothing is known of its effects.
        names::JS | names::MCP_CALL => Some(ToolTraits {
            parallel_safe: false,
            idempotent: false,
        }),
        _ => None,
    }
}

/// The tools a session is offered: every tool, without [`SPAWN_TOOLS`] when it may not spawn
/// (the recursion guard). A session's depth never changes, so its list is stable.
pub fn catalogue_for(may_spawn: bool) -> Vec<ToolSchema> {
    catalogue()
        .into_iter()
        .filter(|t| may_spawn || !SPAWN_TOOLS.contains(&t.name))
        .collect()
}

/// Every tool, in a stable order (a stable list keeps provider prompt caches warm).
pub fn catalogue() -> Vec<ToolSchema> {
    static CATALOGUE: std::sync::OnceLock<Vec<ToolSchema>> = std::sync::OnceLock::new();
    CATALOGUE.get_or_init(build_catalogue).clone()
}

/// A parameter schema from its JSON text: parsing text links a few bytes per schema where
/// `json!` expands to code for every key (about 30 KB of the Worker's wasm for the catalogue,
/// docs/benchmarks.md). Every schema is parsed by the tests that read the catalogue.
fn schema(text: &str) -> crate::llm::ToolParameters {
    serde_json::from_str::<serde_json::Value>(text)
        .expect("a tool's parameter schema is JSON")
        .into()
}

fn build_catalogue() -> Vec<ToolSchema> {
    vec![
        ToolSchema {
            name: names::LIST_SESSIONS,
            description: "List sessions of this workspace, newest first. Returns id, title, status and times.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": "How many (default 20)"},
                    "before": {"type": "string", "description": "Continue after this session id (from a previous page)"}
                },
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::READ_SESSION,
            description: "Read the transcript of another session of this workspace as text. Long transcripts are cut; the result says which sinceCursor continues.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "Session id"},
                    "sinceCursor": {"type": "integer", "minimum": 0, "description": "Start after this cursor (default 0)"}
                },
                "required": ["id"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::REQUEST_ENVIRONMENT,
            description: "Attach an environment (a directory on a runner: a user's Mac or a cloud VM) to this session so that bash, read, write, edit, ls, find and grep can work there. `spec` names an environment definition or an environment a runner offers. The attachment appears in the transcript, with the environment's AGENTS.md if it has one. Some environments need a person's approval first.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "spec": {"type": "string", "description": "Environment definition or offered environment name"},
                    "preference": {"type": "string", "enum": ["local", "cloud", "any"], "description": "Where to run (default any)"},
                    "name": {"type": "string", "description": "Name for it in this session (default: spec)"}
                },
                "required": ["spec"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::DETACH_ENVIRONMENT,
            description: "Detach an environment from this session. A worktree is removed (its branch is kept).",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {"name": {"type": "string", "description": "Environment name in this session"}},
                "required": ["name"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::BASH,
            description: "Run a shell command (bash -c, non-interactive, CI=1, no pager) in an attached environment's working directory. Returns the exit code and output (the tail when long). With background: true it returns a job id at once and the command runs on; when it ends, a wuhu_job_finished_v1 message brings its exit code, duration and the tail of its output (job_status and job_kill take the id).",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "timeout": {"type": "number", "exclusiveMinimum": 0, "description": "Seconds (default: none)"},
                    "background": {"type": "boolean", "description": "Run as a background job (default false)"},
                    "environment": {"type": "string", "description": "Environment name (needed when several are attached)"}
                },
                "required": ["command"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::JOB_STATUS,
            description: "How a background job (bash with background: true) stands: running or how it ended, exit code, duration, and the tail of its output so far.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {"id": {"type": "string", "description": "The job id bash returned"}},
                "required": ["id"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::JOB_KILL,
            description: "Kill a background job's whole process group. Its wuhu_job_finished_v1 message follows (state killed).",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {"id": {"type": "string", "description": "The job id bash returned"}},
                "required": ["id"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::EDIT,
            description: "Replace one exact, unique occurrence of oldText with newText in a file of an attached environment. Returns a diff.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "oldText": {"type": "string"},
                    "newText": {"type": "string"},
                    "environment": {"type": "string", "description": "Environment name (needed when several are attached)"}
                },
                "required": ["path", "oldText", "newText"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::LS,
            description: "List a directory of an attached environment.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory (default: the working directory)"},
                    "limit": {"type": "integer", "minimum": 1},
                    "environment": {"type": "string", "description": "Environment name (needed when several are attached)"}
                },
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::FIND,
            description: "Find files by glob in an attached environment (honours .gitignore).",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Glob, e.g. *.rs or src/**/*.ts"},
                    "path": {"type": "string"},
                    "limit": {"type": "integer", "minimum": 1},
                    "environment": {"type": "string", "description": "Environment name (needed when several are attached)"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::GREP,
            description: "Search file contents by regex in an attached environment (honours .gitignore; long lines cut at 500 chars).",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "pattern": {"type": "string"},
                    "path": {"type": "string"},
                    "glob": {"type": "string"},
                    "ignoreCase": {"type": "boolean"},
                    "literal": {"type": "boolean"},
                    "context": {"type": "integer", "minimum": 0},
                    "limit": {"type": "integer", "minimum": 1},
                    "environment": {"type": "string", "description": "Environment name (needed when several are attached)"}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::JS,
            description: "Run JavaScript (QuickJS) inside the session, with no environment needed. The value of the last expression is returned as JSON (promises are awaited; top-level await works); console output is captured. Available: fetch(url, init) (http/https to public hosts; at most 20 requests and 5 MiB per call), wuhu.sessions.list({limit}), wuhu.sessions.get(id), wuhu.sessions.spawn/send/wait/stop({...}) (the arguments of spawn_session, send_to_session, wait_sessions, stop_session), wuhu.workspace.read(path), .write(path, text), .list(prefix), .remove(path), wuhu.session.setModel({provider, model}) (as set_model), wuhu.mcp.list(server?) and wuhu.mcp.call(server, tool, args) (MCP servers, as mcp_tools and mcp_call; the raw result). Limits: 5 s, 32 MiB.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "The script"}
                },
                "required": ["code"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::MCP_TOOLS,
            description: "List the MCP (Model Context Protocol) servers this turn may use, or the tools of one: each with its description and its arguments' JSON Schema. `query` finds tools by a part of their name or description (across every server when no server is given). Results come 25 tools a page (`offset`).",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "server": {"type": "string", "description": "A server's name (default: list the servers)"},
                    "query": {"type": "string", "description": "Part of a tool's name or description"},
                    "offset": {"type": "integer", "minimum": 0, "description": "Skip this many tools (default 0)"}
                },
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::MCP_CALL,
            description: "Call a tool of an MCP server (see mcp_tools for the servers, their tools and arguments). Text comes back as text; images are attached; long resources are stored as wuhu://blob/ documents you can read. An MCP server's resources are readable with read wuhu://mcp/<server>/<uri>.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "server": {"type": "string"},
                    "tool": {"type": "string"},
                    "arguments": {"type": "object", "description": "The tool's arguments (default {})"}
                },
                "required": ["server", "tool"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::SET_MODEL,
            description: "Switch this session to another model: the next request goes to it (the transcript is converted to its dialect; reasoning of another provider's replies is not sent). `provider` defaults to the current one, `model` to the provider's default. Allowed when everyone this turn acts for may prompt the session; a notice records the switch.",
            parameters: json!({
                "type": "object",
                "properties": {
                    "provider": {"type": "string", "enum": crate::llm::PROVIDERS},
                    "model": {"type": "string", "description": "Model id, such as claude-sonnet-4-5 or gpt-5-mini"}
                },
                "additionalProperties": false
            })
            .into(),
        },
        ToolSchema {
            name: names::SPAWN_SESSION,
            description: "Start a child session that works on `task` on its own (same owner, same access), and return its id at once; its lifecycle (idle with its final message, failed, stopped) reaches you later as a system message, which wakes you when you are idle. With `wait: true`, return its final message instead. Children beyond the concurrency limits wait for a slot; the result says so. `environment`: \"none\" (default), \"inherit\" (your attached environments), or an environment spec to attach for it. A detached child keeps running when you are stopped.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "task": {"type": "string", "description": "The child's first message"},
                    "title": {"type": "string"},
                    "model": {"type": "string", "description": "Model (default: yours)"},
                    "environment": {"type": "string", "description": "none, inherit, or an environment spec"},
                    "wait": {"type": "boolean", "description": "Wait for its first turn to end (default false)"},
                    "detached": {"type": "boolean", "description": "Keep running when this session is stopped (default false)"}
                },
                "required": ["task"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::SEND_TO_SESSION,
            description: "Send a message to one of your child sessions: `steer` reaches it at its next step, `followUp` when it would stop. An idle child starts a turn (through the concurrency gate).",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "content": {"type": "string"},
                    "lane": {"type": "string", "enum": ["steer", "followUp"], "description": "Default followUp"}
                },
                "required": ["id", "content"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::WAIT_SESSIONS,
            description: "Wait until the given child sessions are idle, failed or stopped (or the timeout passes); returns each one's state and final message.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "ids": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "timeoutSeconds": {"type": "number", "exclusiveMinimum": 0, "description": "Default 300, at most 3600"}
                },
                "required": ["ids"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::STOP_SESSION,
            description: "Stop one of your child sessions (and its own running children).",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {"id": {"type": "string"}},
                "required": ["id"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::READ,
            description: "Read a text file or document. `wuhu://workspace/<path>` is the workspace knowledge base (always available; a path ending in `/` lists documents), `wuhu://config/<path>` the server settings (read-only), `wuhu://mcp/<server>/<uri>` a resource of an MCP server, `wuhu://env/<name>/<path>` or a plain path a file in an attached environment. Output is cut at 2000 lines or 50 KB; the result says which offset continues. An image file in an environment (PNG, JPEG, GIF, WebP, at most 5 MiB) is attached as an image you can see.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "wuhu:// URL or a path in an environment"},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based, default 1)"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Most lines to return"},
                    "environment": {"type": "string", "description": "Environment for a plain path (needed when several are attached)"}
                },
                "required": ["path"],
                "additionalProperties": false
            }"#,
            ),
        },
        ToolSchema {
            name: names::WRITE,
            description: "Write a text file or document, replacing it. `wuhu://workspace/<path>` writes the workspace knowledge base (Markdown may start with YAML frontmatter); `wuhu://env/<name>/<path>` or a plain path writes in an attached environment.",
            parameters: schema(
                r#"{
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "wuhu:// URL or a path in an environment"},
                    "content": {"type": "string", "description": "The whole new content"},
                    "environment": {"type": "string", "description": "Environment for a plain path (needed when several are attached)"}
                },
                "required": ["path", "content"],
                "additionalProperties": false
            }"#,
            ),
        },
    ]
}

/// Cuts `text` to the lines `offset..offset+limit` (1-based) and the output limits, and says
/// how to continue: the text plus a hint line when anything follows.
pub fn page_lines(text: &str, offset: usize, limit: Option<usize>) -> String {
    let offset = offset.max(1);
    let total = text.lines().count();
    if total > 0 && offset > total {
        return format!("[offset {offset} is past the end: the text has {total} lines]\n");
    }
    let selected: String = text
        .split_inclusive('\n')
        .skip(offset - 1)
        .take(limit.unwrap_or(usize::MAX))
        .collect();
    let cut = truncate_head(&selected);
    let shown = cut
        .lines_kept
        .max(usize::from(cut.truncated && cut.lines_kept == 0));
    let next = offset + shown;
    let mut out = cut.text;
    if next <= total {
        if !out.ends_with('\n') && !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "[{} more lines: call read with offset={next}]\n",
            total + 1 - next
        ));
    }
    out
}

/// What `set_model` (and js `wuhu.session.setModel`) asks for, from its arguments: the header
/// after the switch, or `None` when `current` already uses that model. The same rules as
/// `PATCH /v1/sessions/:id {provider, model}`.
///
/// # Errors
/// A message for the tool result: arguments not an object of `provider` and/or `model`
/// strings, an unknown provider, an empty or too long model.
pub fn model_switch(
    arguments: &serde_json::Value,
    current: &crate::wire::Header,
) -> Result<Option<crate::wire::Header>, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Arguments {
        #[serde(default)]
        provider: Option<String>,
        #[serde(default)]
        model: Option<String>,
    }
    let arguments: Arguments = serde_json::from_value(arguments.clone())
        .map_err(|e| format!("set_model takes {{provider?, model?}}: {e}"))?;
    if arguments.provider.is_none() && arguments.model.is_none() {
        return Err("set_model needs provider, model or both".into());
    }
    let request = crate::wire::PatchSessionRequest {
        provider: arguments.provider,
        model: arguments.model,
        ..Default::default()
    };
    request.validate()?;
    Ok(request.switched(current))
}

/// Output limits shared by tools: at most this many lines...
pub const MAX_OUTPUT_LINES: usize = 2000;
/// ...and at most this many bytes.
pub const MAX_OUTPUT_BYTES: usize = 50 * 1024;

/// Text cut to the output limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truncated {
    /// The kept head.
    pub text: String,
    /// Whether anything was cut.
    pub truncated: bool,
    /// Whole lines kept.
    pub lines_kept: usize,
    /// Lines in the input.
    pub total_lines: usize,
}

/// Keeps the head of `text` within [`MAX_OUTPUT_LINES`] and [`MAX_OUTPUT_BYTES`], cutting at a
/// line boundary (or at a char boundary when one line alone is too long).
pub fn truncate_head(text: &str) -> Truncated {
    truncate_head_with(text, MAX_OUTPUT_LINES, MAX_OUTPUT_BYTES)
}

/// [`truncate_head`] with explicit limits.
pub fn truncate_head_with(text: &str, max_lines: usize, max_bytes: usize) -> Truncated {
    let total_lines = text.lines().count();
    let mut kept = 0usize;
    let mut end = 0usize;
    for line in text.split_inclusive('\n') {
        if kept == max_lines || end + line.len() > max_bytes {
            break;
        }
        end += line.len();
        kept += 1;
    }
    if kept == 0 && !text.is_empty() {
        // One huge first line: cut it at a char boundary.
        let mut cut = max_bytes.min(text.len());
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        return Truncated {
            text: text[..cut].to_string(),
            truncated: true,
            lines_kept: 0,
            total_lines,
        };
    }
    Truncated {
        text: text[..end].to_string(),
        truncated: end < text.len(),
        lines_kept: kept,
        total_lines,
    }
}

/// Keeps the tail of `text` within [`MAX_OUTPUT_LINES`] and [`MAX_OUTPUT_BYTES`] (what `bash`
/// shows). `text` of the result is the kept tail.
pub fn truncate_tail(text: &str) -> Truncated {
    truncate_tail_with(text, MAX_OUTPUT_LINES, MAX_OUTPUT_BYTES)
}

/// [`truncate_tail`] with explicit limits: cuts at a line boundary, or inside the last line at a
/// char boundary when that line alone is too long.
pub fn truncate_tail_with(text: &str, max_lines: usize, max_bytes: usize) -> Truncated {
    let total_lines = text.lines().count();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut kept = 0usize;
    let mut bytes = 0usize;
    for line in lines.iter().rev() {
        if kept == max_lines || bytes + line.len() > max_bytes {
            break;
        }
        bytes += line.len();
        kept += 1;
    }
    if kept == 0 && !text.is_empty() {
        let mut start = text.len().saturating_sub(max_bytes);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        return Truncated {
            text: text[start..].to_string(),
            truncated: true,
            lines_kept: 0,
            total_lines,
        };
    }
    let start = text.len() - bytes;
    Truncated {
        text: text[start..].to_string(),
        truncated: start > 0,
        lines_kept: kept,
        total_lines,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_cuts_at_lines_and_bytes() {
        let cases: &[(&str, usize, usize, &str, bool)] = &[
            ("a\nb\nc\n", 2, 100, "a\nb\n", true),
            ("a\nb\nc", 5, 100, "a\nb\nc", false),
            ("aaaa\nbb\n", 5, 6, "aaaa\n", true),
            ("ééé", 5, 3, "é", true),
            ("", 5, 5, "", false),
        ];
        for (input, lines, bytes, want, cut) in cases {
            let got = truncate_head_with(input, *lines, *bytes);
            assert_eq!(
                (got.text.as_str(), got.truncated),
                (*want, *cut),
                "input {input:?}"
            );
        }
    }

    #[test]
    fn paging_hints_at_the_next_offset() {
        let text: String = (1..=5).map(|i| format!("l{i}\n")).collect();
        assert_eq!(page_lines(&text, 1, None), text);
        assert_eq!(
            page_lines(&text, 2, Some(2)),
            "l2\nl3\n[2 more lines: call read with offset=4]\n"
        );
        assert_eq!(page_lines(&text, 5, Some(2)), "l5\n");
        assert!(page_lines(&text, 9, None).contains("past the end"));
        let long: String = (1..=3000).map(|i| format!("{i}\n")).collect();
        assert!(
            page_lines(&long, 1, None).ends_with("[1000 more lines: call read with offset=2001]\n")
        );
    }

    #[test]
    fn tail_truncation() {
        let cases: &[(&str, usize, usize, &str, bool)] = &[
            ("a\nb\nc\n", 2, 100, "b\nc\n", true),
            ("a\nb\nc", 5, 100, "a\nb\nc", false),
            ("bb\naaaa\n", 5, 6, "aaaa\n", true),
            ("ééé", 5, 3, "é", true),
            ("", 5, 5, "", false),
        ];
        for (input, lines, bytes, want, cut) in cases {
            let got = truncate_tail_with(input, *lines, *bytes);
            assert_eq!(
                (got.text.as_str(), got.truncated),
                (*want, *cut),
                "input {input:?}"
            );
        }
        let big: String = (0..3000).map(|i| format!("line {i}\n")).collect();
        let got = truncate_tail(&big);
        assert_eq!(got.lines_kept, 2000);
        assert_eq!(got.total_lines, 3000);
        assert!(got.text.starts_with("line 1000\n") && got.text.ends_with("line 2999\n"));
    }

    #[test]
    fn set_model_switches_like_the_patch() {
        let current = crate::wire::Header {
            system_prompt: "s".into(),
            provider: "anthropic".into(),
            model: "claude-sonnet-4-5".into(),
            reasoning: None,
        };
        let header = |provider: &str, model: &str| crate::wire::Header {
            system_prompt: "s".into(),
            provider: provider.into(),
            model: model.into(),
            reasoning: None,
        };
        // (arguments, outcome: Ok(None) no change, Err(part of the message))
        let cases: Vec<(serde_json::Value, Result<Option<crate::wire::Header>, &str>)> = vec![
            (
                json!({"provider": "openai", "model": "gpt-5"}),
                Ok(Some(header("openai", "gpt-5"))),
            ),
            (
                json!({"provider": "openai"}),
                Ok(Some(header("openai", crate::llm::default_model("openai")))),
            ),
            (
                json!({"model": " claude-opus-4-1 "}),
                Ok(Some(header("anthropic", "claude-opus-4-1"))),
            ),
            (json!({"provider": "anthropic"}), Ok(None)),
            (json!({"model": "claude-sonnet-4-5"}), Ok(None)),
            (json!({}), Err("needs provider, model or both")),
            (json!({"provider": "bard"}), Err("unknown provider")),
            (json!({"model": " "}), Err("model must be")),
            (json!({"model": "x".repeat(300)}), Err("model must be")),
            (json!({"model": 3}), Err("set_model takes")),
            (json!({"model": "m", "title": "t"}), Err("set_model takes")),
            (json!("gpt-5"), Err("set_model takes")),
        ];
        for (arguments, want) in cases {
            let got = model_switch(&arguments, &current);
            match want {
                Ok(header) => assert_eq!(got, Ok(header), "{arguments}"),
                Err(part) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(part)),
                    "{arguments}: {got:?}"
                ),
            }
        }
    }

    #[test]
    fn the_recursion_guard_removes_exactly_the_spawn_tools() {
        let all: Vec<&str> = catalogue().iter().map(|t| t.name).collect();
        let guarded: Vec<&str> = catalogue_for(false).iter().map(|t| t.name).collect();
        assert_eq!(catalogue_for(true), catalogue());
        for name in SPAWN_TOOLS {
            assert!(all.contains(&name) && !guarded.contains(&name), "{name}");
        }
        assert_eq!(guarded.len() + SPAWN_TOOLS.len(), all.len());
    }

    /// The schemas are written into every request as they are: compact, an object schema, and
    /// the same JSON as the text they were declared in.
    #[test]
    fn every_catalogued_schema_goes_out_as_compact_json_of_an_object() {
        for tool in catalogue() {
            let text = serde_json::to_string(&tool.parameters).expect("serialises");
            let schema: serde_json::Value = serde_json::from_str(&text).expect("is JSON");
            assert_eq!(text, schema.to_string(), "{}: not compact", tool.name);
            assert_eq!(text.len(), tool.parameters.text_len(), "{}", tool.name);
            assert_eq!(schema["type"], "object", "{}", tool.name);
            assert_eq!(
                crate::llm::ToolParameters::from(schema),
                tool.parameters,
                "{}",
                tool.name
            );
        }
    }

    #[test]
    fn every_catalogued_tool_has_traits() {
        for tool in catalogue() {
            assert!(traits(tool.name).is_some(), "{}", tool.name);
        }
        assert!(traits("made_up").is_none());
    }
}
