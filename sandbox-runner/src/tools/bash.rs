//! `bash {command, timeout?}`: `bash -c` non-interactive (stdin null, `CI=1`, pagers off), in
//! its own process group; stdout and stderr interleaved; the tail of the output kept.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;
use tokio::io::AsyncReadExt;
use tokio::time::Instant;
use wuhu_core::tools::MAX_OUTPUT_BYTES;

use super::{ToolContext, ToolOutput, limit_hint, push_note};
use wuhu_core::tools::truncate_tail;

/// Arguments of `bash`.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct BashArgs {
    /// The command line, run with `bash -c`.
    pub command: String,
    /// Seconds before the process group is killed; no limit when absent.
    #[serde(default)]
    pub timeout: Option<f64>,
}

/// The note a cancelled command's output ends with.
pub const CANCELLED_NOTE: &str = "Command cancelled; its process group was killed";

/// `PATH` when the snapshot has none.
pub const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";

/// How long to keep reading after the command exits while a background process still holds
/// its output pipe.
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// Output kept in memory before it also goes to a log file.
const SPILL_AT: usize = 1024 * 1024;

/// Variables every command gets on top of the snapshot.
pub const NON_INTERACTIVE_ENV: [(&str, &str); 4] = [
    ("CI", "1"),
    ("PAGER", "cat"),
    ("GIT_PAGER", "cat"),
    ("GIT_TERMINAL_PROMPT", "0"),
];

/// The program to start for `name` (`bash`): its absolute path, found in `path` (the
/// command's own `PATH`) the way `execvp` searches, or `name` itself when a relative or empty
/// entry comes before any match (only the child's working directory could resolve it) or
/// nothing matches (the spawn then reports the error).
///
/// An absolute path lets std start the command with `posix_spawn` (vfork: no copy of the
/// runner's page tables); with a bare name and a `PATH` of the child's own, std must fork the
/// runner and search in the child. Measured in docs/benchmarks.md ("Where the runner round trip
/// goes").
pub fn program_in_path(name: &str, path: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    for dir in path.split(':') {
        if !dir.starts_with('/') {
            break;
        }
        let candidate = std::path::Path::new(dir).join(name);
        if std::fs::metadata(&candidate)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        {
            return candidate;
        }
    }
    PathBuf::from(name)
}

/// `bash` for a command with `env`: in `cell` (found by absolute path: a cell starts its program
/// without a `PATH` search), or as it is.
pub fn shell_command(
    cell: Option<&crate::cell::CallCell>,
    env: &std::collections::BTreeMap<String, String>,
) -> tokio::process::Command {
    let bash = program_in_path("bash", command_path(env));
    match cell {
        Some(cell) => {
            let bash = if bash.is_absolute() {
                bash
            } else {
                program_in_path("bash", DEFAULT_PATH)
            };
            cell.command(&bash)
        }
        None => tokio::process::Command::new(bash),
    }
}

/// The lines a call's output ends with for what its cell refused: connections its proxy
/// blocked (`wuhu: blocked connect to …`, with how many in all) and read-only paths of the
/// definition that were not granted. Empty without a cell.
pub fn cell_lines(ctx: &ToolContext) -> (Vec<String>, u64) {
    let Some(cell) = &ctx.cell else {
        return (Vec::new(), 0);
    };
    let (mut lines, count) = cell.blocked();
    if count > lines.len() as u64 {
        lines.push(format!(
            "wuhu: {} more connections blocked",
            count - lines.len() as u64
        ));
    }
    for refused in &cell.policy.refused {
        lines.push(format!("wuhu: not granted: {refused}"));
    }
    (lines, count)
}

/// The command's `PATH`: its snapshot's, or [`DEFAULT_PATH`].
pub fn command_path(env: &std::collections::BTreeMap<String, String>) -> &str {
    env.get("PATH").map_or(DEFAULT_PATH, String::as_str)
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRun {
    /// Interleaved stdout and stderr, tail-truncated.
    pub output: String,
    /// Whether output was cut.
    pub truncated: bool,
    /// Lines of output in all.
    pub total_lines: u64,
    /// Lines kept in `output`.
    pub lines_kept: usize,
    /// Where the full output went when it was cut.
    pub full_output_path: Option<PathBuf>,
    /// Exit code, when it exited normally.
    pub exit_code: Option<i32>,
    /// Signal that killed it, if any.
    pub signal: Option<i32>,
    /// Killed because of the timeout.
    pub timed_out: bool,
    /// Killed because of a cancel.
    pub cancelled: bool,
}

/// Runs `bash` and formats its result.
pub async fn bash(ctx: &ToolContext, args: BashArgs) -> ToolOutput {
    let timeout = match args.timeout {
        None => None,
        Some(t) if t.is_finite() && t > 0.0 && t < 1e9 => Some(Duration::from_secs_f64(t)),
        Some(t) => {
            return ToolOutput::error(format!(
                "invalid timeout {t}: must be a positive number of seconds"
            ));
        }
    };
    let run = match run_command(ctx, &args.command, timeout).await {
        Ok(run) => run,
        Err(message) => return ToolOutput::error(message),
    };
    let (cell_lines, blocked) = cell_lines(ctx);
    let mut content = if run.output.is_empty() && cell_lines.is_empty() {
        String::from("(no output)")
    } else {
        run.output.clone()
    };
    if !cell_lines.is_empty() {
        if !content.is_empty() && !content.ends_with('\n') {
            content.push('\n');
        }
        for line in &cell_lines {
            content.push_str(line);
            content.push('\n');
        }
    }
    if run.truncated {
        let full = run
            .full_output_path
            .as_ref()
            .map(|p| format!(" Full output: {}", p.display()))
            .unwrap_or_default();
        if run.lines_kept == 0 {
            push_note(
                &mut content,
                &format!(
                    "[Showing the last {} KB of a long line.{full}]",
                    MAX_OUTPUT_BYTES / 1024
                ),
            );
        } else {
            push_note(
                &mut content,
                &format!(
                    "[Showing the last {} of {} lines ({} limit).{full}]",
                    run.lines_kept,
                    run.total_lines,
                    limit_hint()
                ),
            );
        }
    }
    let mut is_error = false;
    if run.timed_out {
        is_error = true;
        push_note(
            &mut content,
            &format!(
                "Command timed out after {} seconds; its process group was killed",
                args.timeout.unwrap_or_default()
            ),
        );
    } else if run.cancelled {
        is_error = true;
        push_note(&mut content, CANCELLED_NOTE);
    } else if let Some(signal) = run.signal {
        is_error = true;
        push_note(
            &mut content,
            &format!("Command was killed by signal {signal}"),
        );
    } else if let Some(code) = run.exit_code
        && code != 0
    {
        is_error = true;
        push_note(&mut content, &format!("Command exited with code {code}"));
    }
    let mut details = json!({
            "exitCode": run.exit_code,
            "signal": run.signal,
            "timedOut": run.timed_out,
            "cancelled": run.cancelled,
            "truncated": run.truncated,
            "totalLines": run.total_lines,
            "fullOutputPath": run.full_output_path,
    });
    if blocked > 0 {
        details["blockedConnections"] = json!(blocked);
    }
    ToolOutput {
        content,
        is_error,
        details: Some(details),
    }
}

/// Runs `bash -c command` in the context: cwd and env from the snapshot plus
/// [`NON_INTERACTIVE_ENV`] and `TMPDIR` = the call's temp dir; stdin null; own process group,
/// killed whole on timeout, cancel, or when this future is dropped.
///
/// # Errors
///
/// A message when the process cannot be started.
pub async fn run_command(
    ctx: &ToolContext,
    command: &str,
    timeout: Option<Duration>,
) -> Result<CommandRun, String> {
    if !ctx.cwd.is_dir() {
        return Err(format!(
            "working directory {} no longer exists",
            ctx.cwd.display()
        ));
    }
    let (reader, writer) = std::io::pipe().map_err(|e| format!("cannot create a pipe: {e}"))?;
    let writer_err = writer
        .try_clone()
        .map_err(|e| format!("cannot create a pipe: {e}"))?;
    let mut cmd = shell_command(ctx.cell.as_deref(), &ctx.env);
    cmd.arg("-c")
        .arg(command)
        .current_dir(&ctx.cwd)
        .env_clear()
        .envs(&ctx.env)
        .envs(NON_INTERACTIVE_ENV)
        .env("TMPDIR", &ctx.temp_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(writer_err))
        .process_group(0)
        .kill_on_drop(true);
    if !ctx.env.contains_key("PATH") {
        cmd.env("PATH", DEFAULT_PATH);
    }
    if let Some(cell) = &ctx.cell {
        cmd.envs(cell.env());
    }
    let spawned = cmd.spawn();
    // The command keeps the pipe's write end open until dropped: drop it so EOF can arrive.
    drop(cmd);
    let mut child = spawned.map_err(|e| format!("cannot start bash: {e}"))?;
    let mut group = GroupGuard(child.id().map(|pid| pid as i32));
    let mut pipe = tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(reader))
        .map_err(|e| format!("cannot read the output pipe: {e}"))?;

    let mut collector = Collector::new(ctx);
    let mut buf = vec![0u8; 64 * 1024];
    let started = Instant::now();
    let far = started + Duration::from_secs(86_400 * 365);
    // Live output (`tool_progress`): the rules are `wuhu_core::tool_output::Progress`'.
    let mut progress = ctx.progress.as_ref().map(|sink| (sink, sink.progress()));
    let ms_since_start = || u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut cancel = ctx.cancel.clone();
    let mut status = None;
    let mut eof = false;
    let mut drain_until: Option<Instant> = None;
    let mut drain_expired = false;
    let mut timed_out = false;
    let mut cancelled = false;
    loop {
        if status.is_some() && (eof || drain_expired) {
            break;
        }
        let killed = timed_out || cancelled;
        // When the next progress frame may go (a connection without room waits an interval).
        let progress_due = progress.as_ref().and_then(|(sink, p)| {
            let due = p.due_at()?;
            let due = if sink.has_room() {
                due
            } else {
                ms_since_start() + wuhu_core::tool_output::PROGRESS_INTERVAL_MS
            };
            Some(started + Duration::from_millis(due))
        });
        tokio::select! {
            read = pipe.read(&mut buf), if !eof => match read {
                Ok(0) | Err(_) => eof = true,
                Ok(n) => {
                    collector.push(&buf[..n]);
                    if let Some((sink, p)) = &mut progress {
                        p.push(&buf[..n]);
                        if sink.has_room() && let Some(text) = p.poll(ms_since_start()) {
                            sink.send(text);
                        }
                    }
                }
            },
            () = tokio::time::sleep_until(progress_due.unwrap_or(far)), if progress_due.is_some() && status.is_none() => {
                if let Some((sink, p)) = &mut progress
                    && sink.has_room()
                    && let Some(text) = p.poll(ms_since_start())
                {
                    sink.send(text);
                }
            },
            waited = child.wait(), if status.is_none() => {
                status = Some(waited);
                drain_until = Some(Instant::now() + DRAIN_GRACE);
            },
            () = tokio::time::sleep_until(deadline.unwrap_or(far)), if deadline.is_some() && !killed && status.is_none() => {
                timed_out = true;
                group.kill();
            },
            () = cancel.cancelled(), if !killed && status.is_none() => {
                cancelled = true;
                group.kill();
            },
            () = tokio::time::sleep_until(drain_until.unwrap_or(far)), if drain_until.is_some() => {
                drain_expired = true;
            },
        }
    }
    // Exited by itself: background processes it left behind are its business.
    if !timed_out && !cancelled {
        group.disarm();
    }
    let (exit_code, signal) = match status {
        Some(Ok(status)) => {
            use std::os::unix::process::ExitStatusExt;
            (status.code(), status.signal())
        }
        _ => (None, None),
    };
    let finished = collector.finish();
    Ok(CommandRun {
        output: finished.text,
        truncated: finished.truncated,
        total_lines: finished.total_lines,
        lines_kept: finished.lines_kept,
        full_output_path: finished.full_output_path,
        exit_code,
        signal: if timed_out || cancelled { None } else { signal },
        timed_out,
        cancelled,
    })
}

/// Kills a process group when told to, or when dropped while armed.
pub(crate) struct GroupGuard(pub(crate) Option<i32>);

impl GroupGuard {
    pub(crate) fn kill(&mut self) {
        if let Some(pgid) = self.0
            && pgid > 0
        {
            // SAFETY: kill(2) with a negative pid signals the process group we created.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Collector {
    mem: Vec<u8>,
    /// `mem` no longer starts at the beginning of the output.
    trimmed: bool,
    log: Option<(PathBuf, std::fs::File)>,
    log_failed: bool,
    log_dir: PathBuf,
    call_id: String,
    total_bytes: u64,
    newlines: u64,
    last_byte: Option<u8>,
}

struct Finished {
    text: String,
    truncated: bool,
    total_lines: u64,
    lines_kept: usize,
    full_output_path: Option<PathBuf>,
}

impl Collector {
    fn new(ctx: &ToolContext) -> Collector {
        Collector {
            mem: Vec::new(),
            trimmed: false,
            log: None,
            log_failed: false,
            log_dir: ctx.log_dir.clone(),
            call_id: ctx.call_id.clone(),
            total_bytes: 0,
            newlines: 0,
            last_byte: None,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.total_bytes += chunk.len() as u64;
        self.newlines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
        self.last_byte = chunk.last().copied().or(self.last_byte);
        if let Some((_, file)) = &mut self.log
            && file.write_all(chunk).is_err()
        {
            self.log = None;
            self.log_failed = true;
        }
        self.mem.extend_from_slice(chunk);
        if self.mem.len() > SPILL_AT {
            if self.log.is_none() && !self.log_failed && !self.trimmed {
                self.open_log();
            }
            let keep = 2 * MAX_OUTPUT_BYTES;
            let cut = self.mem.len() - keep;
            self.mem.drain(..cut);
            self.trimmed = true;
        }
    }

    /// Opens the log file and writes what is in memory so far.
    fn open_log(&mut self) {
        let safe_id = wuhu_core::jobs::file_component(&self.call_id);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = self
            .log_dir
            .join(format!("bash-{safe_id}-{}-{nanos}.log", crate::unix_now()));
        let opened = std::fs::create_dir_all(&self.log_dir)
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
            })
            .and_then(|mut file| file.write_all(&self.mem).map(|()| file));
        match opened {
            Ok(file) => self.log = Some((path, file)),
            Err(_) => self.log_failed = true,
        }
    }

    fn finish(mut self) -> Finished {
        let total_lines =
            self.newlines + u64::from(self.total_bytes > 0 && self.last_byte != Some(b'\n'));
        let text = String::from_utf8_lossy(&self.mem).into_owned();
        let text = if self.trimmed {
            // Drop the partial first line left by trimming.
            match text.find('\n') {
                Some(at) if at + 1 < text.len() => text[at + 1..].to_string(),
                _ => text,
            }
        } else {
            text
        };
        let tail = truncate_tail(&text);
        let truncated = tail.truncated || self.trimmed;
        if truncated && self.log.is_none() && !self.log_failed {
            self.open_log();
        }
        Finished {
            text: tail.text,
            truncated,
            total_lines,
            lines_kept: tail.lines_kept,
            full_output_path: self.log.map(|(path, _)| path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::CancelSignal;
    use crate::tools::tests::{context, run};
    use serde_json::json;
    use wuhu_core::wire::runner::EnvironmentKind;

    #[test]
    fn bash_is_found_in_the_commands_path_as_execvp_would() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let make = |sub: &str, mode: u32| {
            let d = dir.path().join(sub);
            std::fs::create_dir_all(&d).unwrap();
            let f = d.join("bash");
            std::fs::write(&f, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            d.display().to_string()
        };
        let plain = make("plain", 0o644);
        let first = make("first", 0o755);
        let second = make("second", 0o755);
        let missing = dir.path().join("missing").display().to_string();
        let cases: &[(String, PathBuf)] = &[
            // The first executable match, past missing dirs and non-executable files.
            (
                format!("{missing}:{plain}:{first}:{second}"),
                PathBuf::from(&first).join("bash"),
            ),
            (
                format!("{second}:{first}"),
                PathBuf::from(&second).join("bash"),
            ),
            // A relative or empty entry before any match: only the child's cwd resolves it.
            (format!("{missing}:relative:{first}"), PathBuf::from("bash")),
            (format!(":{first}"), PathBuf::from("bash")),
            // A relative entry after the match does not matter.
            (
                format!("{first}:relative"),
                PathBuf::from(&first).join("bash"),
            ),
            // Nothing found: the spawn reports it.
            (missing.clone(), PathBuf::from("bash")),
            (String::new(), PathBuf::from("bash")),
        ];
        for (path, want) in cases {
            assert_eq!(&program_in_path("bash", path), want, "PATH={path}");
        }
    }

    #[test]
    fn runs_in_cwd_with_snapshot_env_and_non_interactive_settings() {
        let (_dir, mut ctx) = context(EnvironmentKind::Worktree);
        ctx.env
            .insert(String::from("WUHU_TEST_VAR"), String::from("from-snapshot"));
        // SAFETY: tests in this crate do not read this variable concurrently.
        unsafe { std::env::set_var("WUHU_RUNNER_ONLY", "leak") };
        let out = run(
            &ctx,
            "bash",
            json!({"command": "pwd; echo $CI $PAGER $GIT_PAGER $WUHU_TEST_VAR; echo [$WUHU_RUNNER_ONLY]; echo \"$TMPDIR\"; test -t 0 || echo stdin-not-tty; read -r x || echo stdin-empty"}),
        );
        assert!(!out.is_error, "{}", out.content);
        let want = format!(
            "{}\n1 cat cat from-snapshot\n[]\n{}\nstdin-not-tty\nstdin-empty\n",
            ctx.root.display(),
            ctx.temp_dir.display()
        );
        assert_eq!(out.content, want);
        assert_eq!(out.details.unwrap()["exitCode"], 0);
    }

    #[test]
    fn exit_codes_and_stderr() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let out = run(
            &ctx,
            "bash",
            json!({"command": "echo out; echo err >&2; exit 3"}),
        );
        assert!(out.is_error);
        assert_eq!(out.content, "out\nerr\n\nCommand exited with code 3");
        assert_eq!(out.details.unwrap()["exitCode"], 3);
        let out = run(&ctx, "bash", json!({"command": "true"}));
        assert_eq!((out.content.as_str(), out.is_error), ("(no output)", false));
    }

    #[test]
    fn timeout_kills_the_process_group() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let marker = ctx.root.join("survived");
        let started = std::time::Instant::now();
        let out = run(
            &ctx,
            "bash",
            json!({"command": format!("(sleep 1; touch {}) & echo started; sleep 30", marker.display()), "timeout": 0.3}),
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(out.is_error);
        assert!(
            out.content
                .starts_with("started\n\nCommand timed out after 0.3 seconds"),
            "{}",
            out.content
        );
        assert_eq!(out.details.as_ref().unwrap()["timedOut"], true);
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            !marker.exists(),
            "the background child should have been killed"
        );
        let out = run(&ctx, "bash", json!({"command": "true", "timeout": -1}));
        assert!(out.is_error && out.content.contains("invalid timeout"));
    }

    #[test]
    fn background_processes_do_not_hold_the_call() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let started = std::time::Instant::now();
        let out = run(&ctx, "bash", json!({"command": "sleep 5 & echo done"}));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(out.content, "done\n");
    }

    #[test]
    fn long_output_keeps_the_tail_with_a_hint_and_a_log() {
        let (_dir, ctx) = context(EnvironmentKind::Local);
        let out = run(&ctx, "bash", json!({"command": "seq 1 3000"}));
        assert!(!out.is_error);
        assert!(out.content.starts_with("1001\n"), "{}", &out.content[..20]);
        let details = out.details.unwrap();
        let log = details["fullOutputPath"].as_str().unwrap().to_string();
        assert!(
            out.content.ends_with(&format!(
                "3000\n\n[Showing the last 2000 of 3000 lines (2000 lines / 50 KB limit). Full output: {log}]"
            )),
            "{}",
            &out.content[out.content.len() - 200..]
        );
        assert_eq!(std::fs::read_to_string(&log).unwrap().lines().count(), 3000);
        assert_eq!(details["truncated"], true);
        // Much more than the in-memory limit: the log still has everything.
        let out = run(
            &ctx,
            "bash",
            json!({"command": "yes abcdefghij | head -c 3000000; echo; echo last"}),
        );
        assert!(
            out.content.contains("\nlast\n\n[Showing the last"),
            "{}",
            &out.content[out.content.len() - 300..]
        );
        let details = out.details.unwrap();
        let log = details["fullOutputPath"].as_str().unwrap();
        assert_eq!(std::fs::metadata(log).unwrap().len(), 3_000_006);
        assert!(out.content.len() < MAX_OUTPUT_BYTES + 300);
    }

    #[test]
    fn cancel_kills_the_command() {
        let (_dir, mut ctx) = context(EnvironmentKind::Local);
        let (handle, signal) = CancelSignal::new();
        ctx.cancel = signal;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        let out = rt.block_on(async {
            let call =
                crate::tools::run_tool("bash", json!({"command": "echo hi; sleep 30"}), &ctx);
            let cancel = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                handle.cancel();
                std::future::pending::<()>().await;
            };
            tokio::select! { out = call => out, () = cancel => unreachable!() }
        });
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(out.is_error);
        assert_eq!(
            out.content,
            "hi\n\nCommand cancelled; its process group was killed"
        );
    }
}
