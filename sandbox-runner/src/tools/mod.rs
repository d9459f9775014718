//! The environment tools with Wuhu semantics (inventory §4). Output is cut to
//! [`MAX_OUTPUT_LINES`] lines / [`MAX_OUTPUT_BYTES`] bytes with a hint on how to continue: `read`,
//! `ls`, `find` and `grep` keep the head, `bash` keeps the tail.
//!
//! Every tool gets a [`ToolContext`] built by the [`crate::executor`]; tools never look anything
//! up elsewhere.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::watch;
use wuhu_core::tools::{MAX_OUTPUT_BYTES, MAX_OUTPUT_LINES};
use wuhu_core::wire::runner::EnvironmentKind;

pub mod bash;
pub mod files;
pub mod path;
pub mod search;
pub mod text;

/// Everything a tool may use. Built per call by the executor.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The call id (names logs).
    pub call_id: String,
    /// Canonical environment root.
    pub root: PathBuf,
    /// Environment kind (decides the path policy).
    pub kind: EnvironmentKind,
    /// Working directory from the snapshot; relative paths resolve against it.
    pub cwd: PathBuf,
    /// Environment variables from the snapshot; processes get exactly these (plus `bash`'s
    /// non-interactive settings).
    pub env: BTreeMap<String, String>,
    /// A directory private to this call, removed afterwards (`TMPDIR` for `bash`).
    pub temp_dir: PathBuf,
    /// Where full outputs of truncated `bash` calls are kept.
    pub log_dir: PathBuf,
    /// The calling session's background-job logs (`crate::jobs::session_log_dir`): file tools
    /// may read absolute paths below it whatever the environment's kind, so `read` pages a
    /// job's whole output. Other sessions' logs stay outside.
    pub job_logs: Option<PathBuf>,
    /// Fires when the call is cancelled or hits its deadline.
    pub cancel: CancelSignal,
    /// The call's cell (`None` with `--sandbox off`): `bash` runs in it, the file tools reach
    /// only what it may.
    pub cell: Option<std::sync::Arc<crate::cell::CallCell>>,
    /// Where `bash` sends its output while it runs (`None`: nobody listens).
    pub progress: Option<crate::progress::ProgressSink>,
}

impl ToolContext {
    /// A context for nothing in particular (the lines of a finished job's cell).
    pub(crate) fn detached() -> ToolContext {
        ToolContext {
            call_id: String::new(),
            root: PathBuf::new(),
            kind: EnvironmentKind::Local,
            cwd: PathBuf::new(),
            env: BTreeMap::new(),
            temp_dir: PathBuf::new(),
            log_dir: PathBuf::new(),
            job_logs: None,
            cancel: CancelSignal::never(),
            cell: None,
            progress: None,
        }
    }
}

/// A tool's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolOutput {
    /// Text for the model.
    pub content: String,
    /// Whether the call failed.
    pub is_error: bool,
    /// Structured extras.
    pub details: Option<Value>,
}

impl ToolOutput {
    /// A successful answer.
    pub fn ok(content: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: content.into(),
            is_error: false,
            details: None,
        }
    }

    /// A failed answer.
    pub fn error(content: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: content.into(),
            is_error: true,
            details: None,
        }
    }

    /// The same answer with `details`.
    pub fn with_details(mut self, details: Value) -> ToolOutput {
        self.details = Some(details);
        self
    }
}

/// The receiving side of a cancellation.
#[derive(Clone, Debug)]
pub struct CancelSignal(watch::Receiver<bool>);

/// The sending side of a cancellation.
#[derive(Debug)]
pub struct CancelHandle(watch::Sender<bool>);

impl CancelSignal {
    /// A connected handle and signal.
    pub fn new() -> (CancelHandle, CancelSignal) {
        let (tx, rx) = watch::channel(false);
        (CancelHandle(tx), CancelSignal(rx))
    }

    /// A signal that never fires.
    pub fn never() -> CancelSignal {
        let (handle, signal) = CancelSignal::new();
        std::mem::forget(handle);
        signal
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        *self.0.borrow()
    }

    /// Completes when cancellation is requested (never, if the handle is gone without firing).
    pub async fn cancelled(&mut self) {
        loop {
            if *self.0.borrow_and_update() {
                return;
            }
            if self.0.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl CancelHandle {
    /// Requests cancellation.
    pub fn cancel(&self) {
        self.0.send_replace(true);
    }
}

/// Runs tool `name` with `arguments`. Unknown tools and bad arguments are error outputs.
pub async fn run_tool(name: &str, arguments: Value, ctx: &ToolContext) -> ToolOutput {
    match name {
        "bash" => match parse_args(name, arguments) {
            Ok(args) => bash::bash(ctx, args).await,
            Err(e) => e,
        },
        "read" => blocking(ctx, "read", arguments, files::read).await,
        "write" => blocking(ctx, "write", arguments, files::write).await,
        "edit" => blocking(ctx, "edit", arguments, files::edit).await,
        "ls" => blocking(ctx, "ls", arguments, files::ls).await,
        "find" => blocking(ctx, "find", arguments, search::find).await,
        "grep" => blocking(ctx, "grep", arguments, search::grep).await,
        other => ToolOutput::error(format!(
            "unknown tool {other:?}; this runner has bash, read, write, edit, ls, find and grep"
        )),
    }
}

/// Runs a synchronous tool on the blocking pool; a cancel returns at once (the thread finishes
/// its bounded work in the background).
async fn blocking<A, F>(ctx: &ToolContext, name: &'static str, arguments: Value, f: F) -> ToolOutput
where
    A: DeserializeOwned + Send + 'static,
    F: FnOnce(&ToolContext, A) -> ToolOutput + Send + 'static,
{
    let args: A = match parse_args(name, arguments) {
        Ok(args) => args,
        Err(e) => return e,
    };
    let task_ctx = ctx.clone();
    let task = match ctx.cell.clone() {
        // A thread of its own, confined to the cell before the tool touches a path (Landlock
        // confines one thread; a pooled thread would keep the confinement for other calls).
        Some(cell) => {
            let (done, answer) = tokio::sync::oneshot::channel();
            let spawned = std::thread::Builder::new()
                .name(format!("{name}-in-cell"))
                .spawn(move || {
                    let output = match cell.restrict_thread() {
                        Ok(()) => f(&task_ctx, args),
                        Err(e) => {
                            ToolOutput::error(format!("cannot confine {name} to the cell: {e}"))
                        }
                    };
                    let _ = done.send(output);
                });
            if let Err(e) = spawned {
                return ToolOutput::error(format!("{name} failed: {e}"));
            }
            tokio::spawn(async move {
                answer.await.unwrap_or_else(|_| {
                    ToolOutput::error("the tool's thread ended without an answer")
                })
            })
        }
        None => tokio::task::spawn_blocking(move || f(&task_ctx, args)),
    };
    let mut cancel = ctx.cancel.clone();
    tokio::select! {
        joined = task => match joined {
            Ok(output) => output,
            Err(e) => ToolOutput::error(format!("{name} failed: {e}")),
        },
        () = cancel.cancelled() => cancelled_output(),
    }
}

/// The answer for a cancelled call.
pub fn cancelled_output() -> ToolOutput {
    ToolOutput::error("Cancelled").with_details(serde_json::json!({"cancelled": true}))
}

fn parse_args<A: DeserializeOwned>(name: &str, arguments: Value) -> Result<A, ToolOutput> {
    let arguments = if arguments.is_null() {
        Value::Object(Default::default())
    } else {
        arguments
    };
    serde_json::from_value(arguments)
        .map_err(|e| ToolOutput::error(format!("invalid arguments for {name}: {e}")))
}

/// Appends a note after a blank line, whatever `content` ends with.
pub(crate) fn push_note(content: &mut String, note: &str) {
    if !content.is_empty() && !content.ends_with('\n') {
        content.push('\n');
    }
    content.push('\n');
    content.push_str(note);
}

/// The output limits in words, for hints.
pub(crate) fn limit_hint() -> String {
    format!("{MAX_OUTPUT_LINES} lines / {} KB", MAX_OUTPUT_BYTES / 1024)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A context over a fresh temp root (canonical), cwd = root, env = PATH and HOME.
    pub(crate) fn context(kind: EnvironmentKind) -> (tempfile::TempDir, ToolContext) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap().join("root");
        std::fs::create_dir(&root).unwrap();
        let temp_dir = dir.path().canonicalize().unwrap().join("tmp");
        std::fs::create_dir(&temp_dir).unwrap();
        let env = BTreeMap::from([
            (
                String::from("PATH"),
                std::env::var("PATH").unwrap_or_default(),
            ),
            (String::from("HOME"), root.to_string_lossy().into_owned()),
        ]);
        let ctx = ToolContext {
            call_id: String::from("call-1"),
            root: root.clone(),
            kind,
            cwd: root,
            env,
            temp_dir,
            log_dir: dir.path().canonicalize().unwrap().join("logs"),
            job_logs: None,
            cancel: CancelSignal::never(),
            cell: None,
            progress: None,
        };
        (dir, ctx)
    }

    /// Runs a tool to completion on a current-thread runtime.
    pub(crate) fn run(ctx: &ToolContext, name: &str, args: Value) -> ToolOutput {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(run_tool(name, args, ctx))
    }

    #[test]
    fn unknown_tools_and_bad_arguments_are_errors() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let out = run(&ctx, "rm_rf", Value::Null);
        assert!(out.is_error && out.content.contains("unknown tool"));
        let out = run(&ctx, "read", serde_json::json!({"offset": 1}));
        assert!(
            out.is_error && out.content.contains("missing field `path`"),
            "{}",
            out.content
        );
        let out = run(&ctx, "bash", serde_json::json!({"command": 5}));
        assert!(out.is_error && out.content.starts_with("invalid arguments for bash"));
    }
}
