//! Builds each tool call's context and runs it (seed 003's "context enrichment"): the cwd and
//! env come from the environment's snapshot, a temp dir is made for the call and removed after
//! it, and cancellation and the server's deadline are wired in. Tools get everything they need
//! here and never reach back into a session.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::sync::Arc;

use serde_json::Value;
use wuhu_core::wire::runner::jobs::{KILL_TOOL, STATUS_TOOL};
use wuhu_core::wire::runner::{EnvironmentContext, EnvironmentKind, SecretEnv};

use crate::cell::{CallCell, CellInput, Cells};
use crate::jobs::{Jobs, session_log_dir};
use crate::tools::{CancelSignal, ToolContext, ToolOutput, run_tool};

/// Directories the runner uses for its own bookkeeping.
#[derive(Clone, Debug)]
pub struct RunnerDirs {
    /// Per-call temp dirs are made below this.
    pub temp_root: PathBuf,
    /// Full outputs of truncated `bash` calls.
    pub log_dir: PathBuf,
}

impl RunnerDirs {
    /// Below the system temp dir: `wuhu-runner-<pid>/` for calls, `wuhu-runner-logs/` for logs
    /// (tests; the runner itself uses [`RunnerDirs::private`]).
    pub fn in_system_temp() -> RunnerDirs {
        let temp = std::env::temp_dir();
        RunnerDirs {
            temp_root: temp.join(format!("wuhu-runner-{}", std::process::id())),
            log_dir: temp.join("wuhu-runner-logs"),
        }
    }

    /// Below the runner's private runtime directory (`0700`, [`crate::private_dir`]):
    /// `calls-<pid>/` for calls, `logs/` for logs, both created private now.
    ///
    /// # Errors
    /// When they cannot be created as private directories of this user.
    pub fn private(run_dir: &Path) -> std::io::Result<RunnerDirs> {
        let dirs = RunnerDirs {
            temp_root: run_dir.join(format!("calls-{}", std::process::id())),
            log_dir: run_dir.join("logs"),
        };
        crate::private_dir::create(run_dir)?;
        crate::private_dir::create(&dirs.temp_root)?;
        crate::private_dir::create(&dirs.log_dir)?;
        Ok(dirs)
    }
}

impl RunnerDirs {
    /// Below `base` for a runner that runs each session as its own uid: `calls-<pid>/` and
    /// `logs/`, like [`RunnerDirs::private`], but each may be passed through by the sessions'
    /// uids (`0711`) to reach their own directories (`0700`, theirs) below.
    ///
    /// # Errors
    /// When they cannot be created as directories of this user.
    pub fn isolated(base: &Path) -> std::io::Result<RunnerDirs> {
        let dirs = RunnerDirs {
            temp_root: base.join(format!("calls-{}", std::process::id())),
            log_dir: base.join("logs"),
        };
        for dir in [base, &dirs.temp_root, &dirs.log_dir] {
            crate::cell::uids::create_passable_dir(dir)?;
        }
        Ok(dirs)
    }
}

/// One tool call as the server sent it.
#[derive(Clone, Debug)]
pub struct ToolCall<'a> {
    /// Request id.
    pub id: &'a str,
    /// The environment context from attach.
    pub environment: &'a EnvironmentContext,
    /// Tool name.
    pub tool: &'a str,
    /// Tool arguments.
    pub arguments: Value,
    /// The server's deadline for the whole call.
    pub deadline: Option<Duration>,
    /// The session the call is for.
    pub session_id: &'a str,
    /// The runner's background jobs (`bash {background: true}`, `job_status`, `job_kill`);
    /// without them those are refused.
    pub jobs: Option<&'a Arc<Jobs>>,
    /// The runner's cells; `None` runs the call unconfined (`--sandbox off`).
    pub cells: Option<&'a Arc<Cells>>,
    /// Secrets `bash` gets as environment variables for this call only (never stored).
    pub secret_env: &'a SecretEnv,
    /// Where a `bash` call sends its output while it runs (`None`: the server takes none).
    pub progress: Option<crate::progress::ProgressSink>,
}

/// The session's own home on the runner, `HOME` in its cells (below the runner's runtime
/// directory: `homes/<session>`).
pub fn session_home(dirs: &RunnerDirs, session_id: &str) -> PathBuf {
    dirs.log_dir
        .parent()
        .unwrap_or(&dirs.log_dir)
        .join("homes")
        .join(wuhu_core::jobs::file_component(session_id))
}

/// Makes `home` (private) and links into it each read-only path of `settings` that lies
/// directly below the snapshot's own `HOME` (`~/.rustup` → the real one), so tools find the
/// toolchains a definition grants where they look for them.
fn prepare_home(
    home: &Path,
    session_uid: Option<u32>,
    real_home: Option<&str>,
    settings: &wuhu_core::cell::CellSettings,
) -> Result<(), String> {
    crate::private_dir::create_for(home, session_uid)
        .map_err(|e| format!("cannot create the session's home {}: {e}", home.display()))?;
    let Some(real_home) = real_home.map(Path::new) else {
        return Ok(());
    };
    for granted in &settings.read_only_paths {
        let granted = Path::new(granted);
        if granted.parent() != Some(real_home) {
            continue;
        }
        if let Some(name) = granted.file_name() {
            let link = home.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                let _ = std::os::unix::fs::symlink(granted, &link);
            }
        }
    }
    Ok(())
}

/// The cell for a call of `environment` with `temp_dir`, if cells are on, and the home its
/// commands get (`HOME`).
///
/// # Errors
/// The message of a refused call.
pub fn call_cell(
    cells: Option<&Arc<Cells>>,
    session_id: &str,
    environment: &EnvironmentContext,
    root: &Path,
    temp_dir: &Path,
    session_logs: &Path,
    home: Option<&Path>,
) -> Result<Option<Arc<CallCell>>, String> {
    let Some(cells) = cells else {
        return Ok(None);
    };
    if let Some(home) = home {
        prepare_home(
            home,
            session_uid(Some(cells), session_id),
            environment.snapshot.env.get("HOME").map(String::as_str),
            &environment.cell,
        )?;
    }
    let home = home.map(|h| h.canonicalize().unwrap_or_else(|_| h.to_path_buf()));
    // A worktree's commits write to its repository's git directory.
    let git_dir = environment
        .repo_path
        .as_ref()
        .filter(|_| environment.kind == EnvironmentKind::Worktree)
        .and_then(|repo| Path::new(repo).join(".git").canonicalize().ok());
    let temp_dir = temp_dir
        .canonicalize()
        .unwrap_or_else(|_| temp_dir.to_path_buf());
    let session_logs = session_logs
        .canonicalize()
        .unwrap_or_else(|_| session_logs.to_path_buf());
    cells
        .cell_for(&CellInput {
            session_id,
            kind: environment.kind,
            root,
            git_dir: git_dir.as_deref(),
            temp_dir: &temp_dir,
            session_logs: Some(&session_logs),
            home: home.as_deref(),
            settings: &environment.cell,
        })
        .map_err(|e| format!("this runner refused to run the call: {e}"))
}

/// `session_id`'s own uid, on a runner that runs each session as its own (its directories may
/// belong to it).
fn session_uid(cells: Option<&Arc<Cells>>, session_id: &str) -> Option<u32> {
    cells?.session_uids()?.uid_for(session_id).ok()
}

/// Whether `arguments` ask `bash` to run as a background job.
pub fn is_background(tool: &str, arguments: &Value) -> bool {
    tool == "bash" && arguments.get("background").and_then(Value::as_bool) == Some(true)
}

/// Runs one tool call to its answer. Never fails: problems are error outputs.
pub async fn execute(dirs: &RunnerDirs, call: ToolCall<'_>, cancel: CancelSignal) -> ToolOutput {
    let env = call.environment;
    if call.tool == STATUS_TOOL || call.tool == KILL_TOOL {
        let Some(jobs) = call.jobs else {
            return ToolOutput::error("this runner runs no background jobs");
        };
        return if call.tool == STATUS_TOOL {
            jobs.status(call.session_id, &call.arguments)
        } else {
            jobs.kill(call.session_id, &call.arguments).await
        };
    }
    let root = match Path::new(&env.root).canonicalize() {
        Ok(root) if root.is_dir() => root,
        _ => {
            return ToolOutput::error(format!(
                "environment {:?} is gone: its root {} no longer exists on this runner",
                env.name, env.root
            ));
        }
    };
    let cwd = if env.snapshot.cwd.is_empty() {
        root.clone()
    } else {
        let cwd = PathBuf::from(&env.snapshot.cwd);
        cwd.canonicalize().unwrap_or(cwd)
    };
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let temp_dir = dirs
        .temp_root
        .join(format!("call-{}", NEXT.fetch_add(1, Ordering::Relaxed)));
    // One mkdir in the usual case (the temp root exists after the first call).
    let created = std::fs::create_dir(&temp_dir).or_else(|_| std::fs::create_dir_all(&temp_dir));
    if let Err(e) = created {
        return ToolOutput::error(format!(
            "cannot create a temp dir {}: {e}",
            temp_dir.display()
        ));
    }
    // The session's logs (full outputs of long commands, job logs): its file tools and its
    // cells may read them, no other session's.
    let session_logs = session_log_dir(&dirs.log_dir, call.session_id);
    if let Err(e) =
        crate::private_dir::create_for(&session_logs, session_uid(call.cells, call.session_id))
    {
        let _ = std::fs::remove_dir(&temp_dir);
        return ToolOutput::error(format!(
            "cannot create the session's log directory {}: {e}",
            session_logs.display()
        ));
    }
    let (inner_handle, inner_signal) = CancelSignal::new();
    let mut ctx = ToolContext {
        call_id: call.id.to_string(),
        root,
        kind: env.kind,
        cwd,
        env: env.snapshot.env.clone(),
        temp_dir: temp_dir.clone(),
        log_dir: session_logs.clone(),
        job_logs: Some(session_logs.clone()),
        cancel: inner_signal,
        cell: None,
        progress: None,
    };
    if call.tool == "bash" {
        ctx.progress = call.progress.clone();
        // Over the snapshot's variables: a secret wins over a captured variable of its name.
        ctx.env.extend(
            call.secret_env
                .0
                .iter()
                .map(|(name, value)| (name.clone(), value.clone())),
        );
    }
    if is_background(call.tool, &call.arguments) {
        let _ = std::fs::remove_dir(&temp_dir);
        let Some(jobs) = call.jobs else {
            return ToolOutput::error("this runner runs no background jobs");
        };
        let mut arguments = call.arguments;
        if let Value::Object(map) = &mut arguments {
            map.remove("background");
        }
        let (cells, root) = (call.cells, ctx.root.clone());
        let home = session_home(dirs, call.session_id);
        if cells.is_some() {
            ctx.env
                .insert(String::from("HOME"), home.to_string_lossy().into_owned());
        }
        let session_id = call.session_id;
        let make_cell = |job_temp: &Path| {
            call_cell(
                cells,
                session_id,
                env,
                &root,
                job_temp,
                &session_logs,
                Some(&home),
            )
        };
        return match serde_json::from_value::<crate::tools::bash::BashArgs>(arguments) {
            Ok(args) => jobs.start(&ctx, call.session_id, &env.name, args, make_cell),
            Err(e) => ToolOutput::error(format!("invalid arguments for bash: {e}")),
        };
    }
    let home = session_home(dirs, call.session_id);
    match call_cell(
        call.cells,
        call.session_id,
        env,
        &ctx.root,
        &temp_dir,
        &session_logs,
        Some(&home),
    ) {
        Ok(Some(cell)) => {
            // The runner's home is not the cell's: its commands and `~` of its file tools get
            // the session's own.
            ctx.env
                .insert(String::from("HOME"), home.to_string_lossy().into_owned());
            ctx.cell = Some(cell);
        }
        Ok(None) => {}
        Err(e) => {
            let _ = std::fs::remove_dir(&temp_dir);
            return ToolOutput::error(e);
        }
    }
    let far = tokio::time::Instant::now() + Duration::from_secs(86_400 * 365);
    let deadline = call.deadline.map(|d| tokio::time::Instant::now() + d);
    let mut outer = cancel;
    let mut stopped_by_deadline = false;
    let mut stopping = false;
    let tool = run_tool(call.tool, call.arguments, &ctx);
    tokio::pin!(tool);
    let mut output = loop {
        tokio::select! {
            output = &mut tool => break output,
            () = outer.cancelled(), if !stopping => {
                stopping = true;
                inner_handle.cancel();
            },
            () = tokio::time::sleep_until(deadline.unwrap_or(far)), if deadline.is_some() && !stopping => {
                stopping = true;
                stopped_by_deadline = true;
                inner_handle.cancel();
            },
        }
    };
    // One rmdir when the call left nothing behind; else remove the whole tree.
    if std::fs::remove_dir(&temp_dir).is_err() {
        let _ = std::fs::remove_dir_all(&temp_dir);
    }
    if stopped_by_deadline {
        output.is_error = true;
        let content = if output.content == crate::tools::cancelled_output().content {
            String::new()
        } else {
            output.content
        };
        let mut content = content
            .strip_suffix(crate::tools::bash::CANCELLED_NOTE)
            .map(|c| c.trim_end_matches('\n').to_string() + "\n")
            .unwrap_or(content);
        crate::tools::push_note(
            &mut content,
            &format!(
                "[Stopped: the call exceeded its deadline of {} ms]",
                call.deadline.unwrap_or_default().as_millis()
            ),
        );
        output.content = content;
        if let Some(Value::Object(details)) = &mut output.details {
            details.insert(String::from("deadlineExceeded"), Value::Bool(true));
            details.insert(String::from("cancelled"), Value::Bool(false));
        } else {
            output.details = Some(serde_json::json!({"deadlineExceeded": true}));
        }
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;
    use wuhu_core::wire::runner::{EnvironmentKind, Snapshot};

    fn env(root: &Path, vars: &[(&str, &str)]) -> EnvironmentContext {
        let mut env: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.insert(String::from("PATH"), std::env::var("PATH").unwrap());
        EnvironmentContext {
            name: String::from("e"),
            kind: EnvironmentKind::FolderTemplate,
            root: root.to_string_lossy().into_owned(),
            snapshot: Snapshot {
                cwd: root.join("sub").to_string_lossy().into_owned(),
                env,
                captured_at: 0,
            },
            repo_path: None,
            branch: None,
            cell: Default::default(),
        }
    }

    fn dirs(base: &Path) -> RunnerDirs {
        RunnerDirs {
            temp_root: base.join("calls"),
            log_dir: base.join("logs"),
        }
    }

    #[tokio::test]
    async fn context_comes_from_the_snapshot_and_the_temp_dir_is_removed() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().canonicalize().unwrap().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let environment = env(&root, &[("GREETING", "hola")]);
        let dirs = dirs(base.path());
        let out = execute(
            &dirs,
            ToolCall {
                id: "c1",
                environment: &environment,
                tool: "bash",
                arguments: json!({"command": "pwd; echo $GREETING; echo $TMPDIR; touch \"$TMPDIR/x\""}),
                deadline: None,
                session_id: "s1",
                jobs: None,
                cells: None,
                secret_env: &SecretEnv::default(),
                progress: None,
            },
            CancelSignal::never(),
        )
        .await;
        assert!(!out.is_error, "{}", out.content);
        let lines: Vec<&str> = out.content.lines().collect();
        assert_eq!(lines[0], root.join("sub").to_string_lossy());
        assert_eq!(lines[1], "hola");
        assert!(lines[2].starts_with(&*dirs.temp_root.to_string_lossy()));
        assert!(!Path::new(lines[2]).exists(), "per-call temp dir removed");
        // Relative paths of file tools resolve against the snapshot cwd.
        let out = execute(
            &dirs,
            ToolCall {
                id: "c2",
                environment: &environment,
                tool: "write",
                arguments: json!({"path": "f.txt", "content": "x"}),
                deadline: None,
                session_id: "s1",
                jobs: None,
                cells: None,
                secret_env: &SecretEnv::default(),
                progress: None,
            },
            CancelSignal::never(),
        )
        .await;
        assert!(!out.is_error, "{}", out.content);
        assert!(root.join("sub/f.txt").exists());
    }

    #[tokio::test]
    async fn deadline_and_missing_root() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().canonicalize().unwrap().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        let environment = env(&root, &[]);
        let dirs = dirs(base.path());
        let started = std::time::Instant::now();
        let out = execute(
            &dirs,
            ToolCall {
                id: "c1",
                environment: &environment,
                tool: "bash",
                arguments: json!({"command": "echo before; sleep 30"}),
                deadline: Some(Duration::from_millis(300)),
                session_id: "s1",
                jobs: None,
                cells: None,
                secret_env: &SecretEnv::default(),
                progress: None,
            },
            CancelSignal::never(),
        )
        .await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(out.is_error);
        assert_eq!(
            out.content,
            "before\n\n[Stopped: the call exceeded its deadline of 300 ms]"
        );
        assert_eq!(out.details.unwrap()["deadlineExceeded"], true);
        let gone = env(&base.path().join("gone"), &[]);
        let out = execute(
            &dirs,
            ToolCall {
                id: "c2",
                environment: &gone,
                tool: "ls",
                arguments: json!({}),
                deadline: None,
                session_id: "s1",
                jobs: None,
                cells: None,
                secret_env: &SecretEnv::default(),
                progress: None,
            },
            CancelSignal::never(),
        )
        .await;
        assert!(
            out.is_error && out.content.contains("is gone"),
            "{}",
            out.content
        );
    }
}
