//! Background jobs: `bash {command, background: true}` answers at once with a job id and the
//! command runs on. Jobs belong to the runner **process**, not to a connection: a reconnect
//! neither kills nor forgets them, and a job that ends while the runner is disconnected is
//! reported after the next `welcome`. A runner that exits kills its jobs' process groups; one
//! that is killed outright cannot, and the next runner process kills what it left (records in
//! `<log dir>/job-records/`, [`Jobs::new`]). Either way the session concludes the jobs failed
//! because their runner went away (`wuhu_core::jobs`).
//!
//! Bounds (`wuhu_core::wire::runner::jobs`): `MAX_RUNNING_PER_RUNNER` running jobs,
//! `MAX_RUNNING_PER_SESSION` per session; [`MAX_FINISHED_KEPT`] finished jobs remembered (the oldest is forgotten first, with its
//! output file). Output passes through the runner to `<log dir>/jobs/<session>/<job>.log`, which
//! is cut to its last `LOG_KEEP_BYTES` when it reaches `MAX_LOG_BYTES`; the file is kept only
//! when the output is longer than the report's tail, and the session's `read` may read it (and
//! no other session's: [`crate::tools::ToolContext::job_logs`]).

use std::collections::{HashMap, VecDeque};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use wuhu_core::tools::truncate_tail_with;
use wuhu_core::wire::runner::jobs::{
    FINISHED_EVENT, LOG_KEEP_BYTES, MAX_FINISHED_KEPT, MAX_LOG_BYTES, TAIL_BYTES, TAIL_LINES,
    UNKNOWN_JOB,
};
use wuhu_core::wire::runner::{JobReport, JobState, RunnerMessage};

use crate::cell::CallCell;
use crate::tools::bash::{BashArgs, DEFAULT_PATH, GroupGuard, NON_INTERACTIVE_ENV, shell_command};
use crate::tools::{CancelHandle, CancelSignal, ToolContext, ToolOutput};

/// How long `job_kill` waits for the killed job to be reaped before it answers.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How much of the log's end is read to make the tail.
const TAIL_READ_BYTES: u64 = 4 * TAIL_BYTES as u64;
/// How long a job's end waits for the rest of its output once its process exited (a process
/// it left behind may hold the output open; the end is then reported without waiting longer).
const OUTPUT_WAIT: Duration = Duration::from_secs(2);
/// The directory of job records below the log dir: one file per running job, naming the
/// runner process and the job's process group, so a runner that starts after another died
/// kills the jobs it left ([`Jobs::new`]).
const RECORDS_DIR: &str = "job-records";

struct Job {
    id: String,
    session_id: String,
    environment: String,
    command: String,
    started_at_ms: u64,
    started: Instant,
    log_path: PathBuf,
    /// Fires to kill the job; `None` once it ended.
    kill: Option<CancelHandle>,
    /// Turns `true` when the job ended.
    done: watch::Receiver<bool>,
    /// How it ended.
    report: Option<JobReport>,
    /// Whether its end was handed to a connection.
    delivered: bool,
}

#[derive(Default)]
struct Inner {
    jobs: HashMap<String, Job>,
    /// Finished jobs, oldest first (for forgetting).
    finished: VecDeque<String>,
    /// The current connection's outgoing frames, while connected.
    out: Option<mpsc::UnboundedSender<RunnerMessage>>,
    seq: u64,
}

/// The runner process's background jobs.
pub struct Jobs {
    inner: Mutex<Inner>,
    log_dir: PathBuf,
    temp_root: PathBuf,
    seed: u64,
    /// Where the output file is cut ([`MAX_LOG_BYTES`], [`LOG_KEEP_BYTES`]).
    log_cap: LogCap,
}

/// When a job's output file is cut, and to how much.
#[derive(Clone, Copy, Debug)]
struct LogCap {
    max: u64,
    keep: u64,
}

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs")
            .field("jobs", &self.lock().jobs.len())
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The directory of `session_id`'s job logs below `log_dir`.
pub fn session_log_dir(log_dir: &Path, session_id: &str) -> PathBuf {
    log_dir
        .join("jobs")
        .join(wuhu_core::jobs::file_component(session_id))
}

impl Jobs {
    /// No jobs yet; logs go below `log_dir`, temp dirs below `temp_root`.
    pub fn new(log_dir: PathBuf, temp_root: PathBuf) -> Jobs {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut urandom = [0u8; 8];
        let from_os = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut urandom));
        let seed = if from_os.is_ok() {
            u64::from_le_bytes(urandom)
        } else {
            nanos ^ (u64::from(std::process::id()) << 32)
        };
        let orphans = kill_orphans(&log_dir.join(RECORDS_DIR));
        if orphans > 0 {
            eprintln!(
                "wuhu-runner: killed {orphans} background job(s) left running by a runner process that ended"
            );
        }
        Jobs {
            inner: Mutex::new(Inner::default()),
            log_dir,
            temp_root,
            seed,
            log_cap: LogCap {
                max: MAX_LOG_BYTES,
                keep: LOG_KEEP_BYTES,
            },
        }
    }

    /// Cuts output files at `max` bytes to their last `keep` (tests use small ones).
    #[cfg(test)]
    fn with_log_cap(mut self, max: u64, keep: u64) -> Jobs {
        self.log_cap = LogCap { max, keep };
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection was welcomed: ends are sent on it, starting with those not delivered yet.
    pub fn connected(&self, out: mpsc::UnboundedSender<RunnerMessage>) {
        let mut inner = self.lock();
        let mut pending: Vec<&mut Job> = inner
            .jobs
            .values_mut()
            .filter(|j| j.report.is_some() && !j.delivered)
            .collect();
        pending.sort_by_key(|j| j.started_at_ms);
        for job in pending {
            if let Some(report) = &job.report
                && out.send(finished_event(job, report)).is_ok()
            {
                job.delivered = true;
            }
        }
        inner.out = Some(out);
    }

    /// The connection ended: ends wait for the next one.
    pub fn disconnected(&self) {
        self.lock().out = None;
    }

    /// How many jobs run (all, and `session_id`'s).
    pub fn running(&self, session_id: &str) -> (usize, usize) {
        let inner = self.lock();
        let running = inner.jobs.values().filter(|j| j.report.is_none());
        let (mut all, mut mine) = (0, 0);
        for job in running {
            all += 1;
            if job.session_id == session_id {
                mine += 1;
            }
        }
        (all, mine)
    }

    /// Starts `args.command` as a job of `session_id` in `ctx` (its cwd and env; its temp dir,
    /// cell and cancel signal are not used: the job gets its own temp dir, and `make_cell`
    /// makes its cell for that temp dir). Answers at once.
    pub fn start(
        self: &Arc<Self>,
        ctx: &ToolContext,
        session_id: &str,
        environment: &str,
        args: BashArgs,
        make_cell: impl FnOnce(&Path) -> Result<Option<Arc<CallCell>>, String>,
    ) -> ToolOutput {
        let timeout = match args.timeout {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 && t < 1e9 => Some(Duration::from_secs_f64(t)),
            Some(t) => {
                return ToolOutput::error(format!(
                    "invalid timeout {t}: must be a positive number of seconds"
                ));
            }
        };
        let (all, mine) = self.running(session_id);
        if let Err(refusal) = wuhu_core::jobs::runner_admits(all, mine) {
            return ToolOutput::error(refusal);
        }
        if !ctx.cwd.is_dir() {
            return ToolOutput::error(format!(
                "working directory {} no longer exists",
                ctx.cwd.display()
            ));
        }
        let job_id = {
            let mut inner = self.lock();
            inner.seq += 1;
            let mut rng = wuhu_core::SplitMix64::new(self.seed ^ inner.seq.wrapping_mul(0x9E37));
            format!("job-{:016x}", rng.next_u64())
        };
        let log_dir = session_log_dir(&self.log_dir, session_id);
        let log_path = log_dir.join(format!("{job_id}.log"));
        let temp_dir = self.temp_root.join(&job_id);
        let records = self.log_dir.join(RECORDS_DIR);
        let opened = std::fs::create_dir_all(&log_dir)
            .and_then(|()| std::fs::create_dir_all(&temp_dir))
            .and_then(|()| std::fs::create_dir_all(&records))
            .and_then(|()| {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&log_path)
            });
        let log = match opened {
            Ok(log) => log,
            Err(e) => return ToolOutput::error(format!("cannot create the job's log file: {e}")),
        };
        let cell = match make_cell(&temp_dir) {
            Ok(cell) => cell,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&temp_dir);
                let _ = std::fs::remove_file(&log_path);
                return ToolOutput::error(e);
            }
        };
        // The output passes through the runner (one pipe for stdout and stderr), which writes
        // it to the log file and cuts the file at its bound.
        let pipe = std::io::pipe().and_then(|(reader, writer)| {
            let err = writer.try_clone()?;
            Ok((reader, writer, err))
        });
        let (reader, out, err) = match pipe {
            Ok(pipe) => pipe,
            Err(e) => {
                return ToolOutput::error(format!("cannot create the job's output pipe: {e}"));
            }
        };
        let mut cmd = shell_command(cell.as_deref(), &ctx.env);
        cmd.arg("-c")
            .arg(&args.command)
            .current_dir(&ctx.cwd)
            .env_clear()
            .envs(&ctx.env)
            .envs(NON_INTERACTIVE_ENV)
            .env("TMPDIR", &temp_dir)
            .env("WUHU_JOB_ID", &job_id)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .process_group(0)
            .kill_on_drop(true);
        if !ctx.env.contains_key("PATH") {
            cmd.env("PATH", DEFAULT_PATH);
        }
        if let Some(cell) = &cell {
            cmd.envs(cell.env());
        }
        // Taken before the spawn, so a job's duration is never shorter than its command's run
        // (`sleep 2` once reported 1,99x ms when the clock started after spawn returned).
        let started = Instant::now();
        let started_at_ms = now_ms();
        let child = match cmd.spawn() {
            Ok(child) => child,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&temp_dir);
                let _ = std::fs::remove_file(&log_path);
                return ToolOutput::error(format!("cannot start bash: {e}"));
            }
        };
        // Our copies of the pipe's write end go with the command: the output ends when the
        // job's processes close theirs.
        drop(cmd);
        let cap = self.log_cap;
        let (copied_tx, copied) = tokio::sync::oneshot::channel();
        let copier = std::thread::Builder::new()
            .name(format!("{job_id}-output"))
            .spawn(move || {
                let _ = copied_tx.send(copy_capped(reader, log, cap));
            });
        if let Err(e) = copier {
            // Without a reader the job would block on a full pipe: it is killed at once.
            let mut guard = GroupGuard(child.id().map(|pid| pid as i32));
            guard.kill();
            let _ = std::fs::remove_dir_all(&temp_dir);
            let _ = std::fs::remove_file(&log_path);
            return ToolOutput::error(format!("cannot start the job's output reader: {e}"));
        }
        let record = records.join(&job_id);
        if let Some(pid) = child.id() {
            // Best effort: without it, only a runner that dies leaves this job behind.
            let _ = std::fs::write(&record, format!("{} {pid}\n", std::process::id()));
        }
        let (kill, kill_signal) = CancelSignal::new();
        let (done_tx, done) = watch::channel(false);
        let command = wuhu_core::jobs::short_command(&args.command);
        let log_path_of_job = log_path.clone();
        self.lock().jobs.insert(
            job_id.clone(),
            Job {
                id: job_id.clone(),
                session_id: session_id.to_string(),
                environment: environment.to_string(),
                command: command.clone(),
                started_at_ms,
                started,
                log_path: log_path_of_job,
                kill: Some(kill),
                done,
                report: None,
                delivered: false,
            },
        );
        let jobs = self.clone();
        let id = job_id.clone();
        // Made here, not in the task: a runtime shutting down before the task first runs drops
        // it unpolled, and the guard, moved into it, still kills the job's process group.
        let group = GroupGuard(child.id().map(|pid| pid as i32));
        tokio::spawn(async move {
            let ended = wait_for(child, group, kill_signal, timeout).await;
            let _ = std::fs::remove_file(&record);
            let _ = std::fs::remove_dir_all(&temp_dir);
            let copied = tokio::time::timeout(OUTPUT_WAIT, copied)
                .await
                .ok()
                .and_then(Result::ok);
            // What the cell refused ends the job's output (its proxy closes here).
            if let Some(cell) = cell {
                let ctx = ToolContext {
                    cell: Some(cell),
                    ..crate::tools::ToolContext::detached()
                };
                let (lines, _) = crate::tools::bash::cell_lines(&ctx);
                if !lines.is_empty()
                    && let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(&log_path)
                {
                    use std::io::Write;
                    let _ = file.write_all(format!("{}\n", lines.join("\n")).as_bytes());
                }
            }
            // Reading the log may take a while: not under the lock, not on a runtime thread.
            let (tail, truncated, lines_in_file) =
                tokio::task::spawn_blocking(move || read_tail(&log_path))
                    .await
                    .unwrap_or_default();
            let (truncated, total_lines) = match copied {
                Some(copied) => (truncated || copied.cut, copied.lines),
                None => (truncated, lines_in_file),
            };
            jobs.finish(&id, ended, (tail, truncated, total_lines));
            let _ = done_tx.send(true);
        });
        ToolOutput::ok(format!(
            "Started background job {job_id}: `{command}`. It runs on; when it ends, a \
             wuhu_job_finished_v1 message brings its exit code, duration and the end of its \
             output. job_status {{\"id\": \"{job_id}\"}} shows how it stands, job_kill kills it."
        ))
        .with_details(json!({"jobId": job_id, "background": true}))
    }

    /// Records how job `id` ended and sends its event when connected; forgets the oldest
    /// finished jobs beyond the bound.
    fn finish(&self, id: &str, ended: Ended, (tail, truncated, total_lines): (String, bool, u64)) {
        let mut inner = self.lock();
        let Some(job) = inner.jobs.get_mut(id) else {
            return;
        };
        let state = if ended.killed {
            JobState::Killed
        } else if ended.exit_code == Some(0) {
            JobState::Succeeded
        } else {
            JobState::Failed
        };
        let full_output_path = if truncated {
            Some(job.log_path.to_string_lossy().into_owned())
        } else {
            let _ = std::fs::remove_file(&job.log_path);
            None
        };
        let report = JobReport {
            job_id: id.to_string(),
            command: job.command.clone(),
            state,
            exit_code: ended.exit_code,
            signal: if ended.killed || ended.timed_out {
                None
            } else {
                ended.signal
            },
            timed_out: ended.timed_out,
            started_at_ms: job.started_at_ms,
            duration_ms: job.started.elapsed().as_millis() as u64,
            total_lines,
            output_tail: tail,
            truncated,
            full_output_path,
        };
        job.kill = None;
        let event = finished_event(job, &report);
        job.report = Some(report);
        if let Some(out) = &inner.out
            && out.send(event).is_ok()
            && let Some(job) = inner.jobs.get_mut(id)
        {
            job.delivered = true;
        }
        inner.finished.push_back(id.to_string());
        while inner.finished.len() > MAX_FINISHED_KEPT {
            if let Some(old) = inner.finished.pop_front()
                && let Some(job) = inner.jobs.remove(&old)
            {
                let _ = std::fs::remove_file(&job.log_path);
            }
        }
    }

    /// `job_status {id}` for `session_id`: how the job stands; `content` is its output's tail.
    pub fn status(&self, session_id: &str, arguments: &serde_json::Value) -> ToolOutput {
        let id = match job_id_argument(arguments) {
            Ok(id) => id,
            Err(e) => return e,
        };
        let view = {
            let inner = self.lock();
            let Some(job) = inner.jobs.get(&id).filter(|j| j.session_id == session_id) else {
                return unknown_job(&id);
            };
            JobView::of(job)
        };
        status_output(view)
    }

    /// `job_kill {id}` for `session_id`: kills the job's process group and answers how it
    /// stands once it was reaped (or after a few seconds).
    pub async fn kill(&self, session_id: &str, arguments: &serde_json::Value) -> ToolOutput {
        let id = match job_id_argument(arguments) {
            Ok(id) => id,
            Err(e) => return e,
        };
        let mut done = {
            let inner = self.lock();
            let Some(job) = inner.jobs.get(&id).filter(|j| j.session_id == session_id) else {
                return unknown_job(&id);
            };
            if let Some(kill) = &job.kill {
                kill.cancel();
            }
            job.done.clone()
        };
        let _ = tokio::time::timeout(KILL_WAIT, done.wait_for(|d| *d)).await;
        let view = self.lock().jobs.get(&id).map(JobView::of);
        match view {
            Some(view) => status_output(view),
            None => unknown_job(&id),
        }
    }
}

fn job_id_argument(arguments: &serde_json::Value) -> Result<String, ToolOutput> {
    arguments
        .get("id")
        .and_then(|v| v.as_str())
        .filter(|id| !id.is_empty() && id.len() <= 64)
        .map(str::to_string)
        .ok_or_else(|| ToolOutput::error("invalid arguments: `id` (the job id) is required"))
}

fn unknown_job(id: &str) -> ToolOutput {
    ToolOutput::error(format!(
        "no job {id:?} for this session on this runner (it never ran here, or the runner \
         restarted since, which ends its jobs)"
    ))
    .with_details(json!({UNKNOWN_JOB: true}))
}

/// What `job_status` needs of a job, taken out of the lock.
struct JobView {
    id: String,
    command: String,
    started_at_ms: u64,
    started: Instant,
    log_path: PathBuf,
    report: Option<JobReport>,
}

impl JobView {
    fn of(job: &Job) -> JobView {
        JobView {
            id: job.id.clone(),
            command: job.command.clone(),
            started_at_ms: job.started_at_ms,
            started: job.started,
            log_path: job.log_path.clone(),
            report: job.report.clone(),
        }
    }
}

/// A job as `job_status` tells it: the report (without its tail) in `details.job`, the tail in
/// `content`.
fn status_output(job: JobView) -> ToolOutput {
    let (report, tail) = match &job.report {
        Some(report) => (report.clone(), report.output_tail.clone()),
        None => {
            let (tail, truncated, total_lines) = read_tail(&job.log_path);
            (
                JobReport {
                    job_id: job.id.clone(),
                    command: job.command.clone(),
                    state: JobState::Running,
                    exit_code: None,
                    signal: None,
                    timed_out: false,
                    started_at_ms: job.started_at_ms,
                    duration_ms: job.started.elapsed().as_millis() as u64,
                    total_lines,
                    output_tail: String::new(),
                    truncated,
                    full_output_path: Some(job.log_path.to_string_lossy().into_owned()),
                },
                tail,
            )
        }
    };
    let summary = match report.state {
        JobState::Running => format!(
            "Job {} is running ({} s so far).",
            report.job_id,
            report.duration_ms / 1000
        ),
        state => format!(
            "Job {} {} (exit code {}) after {} ms.",
            report.job_id,
            state.as_str(),
            report
                .exit_code
                .map_or_else(|| String::from("none"), |c| c.to_string()),
            report.duration_ms
        ),
    };
    let content = if tail.is_empty() {
        format!("{summary} No output yet.")
    } else {
        format!("{summary} The end of its output:\n\n{tail}")
    };
    let details = JobReport {
        output_tail: String::new(),
        ..report
    };
    ToolOutput::ok(content).with_details(json!({ "job": details }))
}

fn finished_event(job: &Job, report: &JobReport) -> RunnerMessage {
    RunnerMessage::Event {
        name: FINISHED_EVENT.to_string(),
        session_id: Some(job.session_id.clone()),
        environment: Some(job.environment.clone()),
        data: serde_json::to_value(report).unwrap_or_default(),
    }
}

/// The end of the output in `path`: (tail, whether it is only the tail, lines in all).
fn read_tail(path: &Path) -> (String, bool, u64) {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return (String::new(), false, 0);
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    // Count lines over the whole file, in chunks.
    let mut newlines = 0u64;
    let mut last = None;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                newlines += buf[..n].iter().filter(|b| **b == b'\n').count() as u64;
                last = buf[..n].last().copied();
            }
        }
    }
    let total_lines = newlines + u64::from(len > 0 && last != Some(b'\n'));
    let start = len.saturating_sub(TAIL_READ_BYTES);
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_ok() {
        let _ = file.take(TAIL_READ_BYTES).read_to_end(&mut bytes);
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let text = if start > 0 {
        match text.find('\n') {
            Some(at) if at + 1 < text.len() => text[at + 1..].to_string(),
            _ => text,
        }
    } else {
        text
    };
    let tail = truncate_tail_with(&text, TAIL_LINES, TAIL_BYTES);
    (tail.text, tail.truncated || start > 0, total_lines)
}

struct Ended {
    exit_code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    killed: bool,
}

/// Waits for the job's process; kills its whole process group on `kill` or `timeout`.
/// Dropped before the job ended (the runner shuts down and its runtime drops this task),
/// `group` kills the job's process group: a runner does not leave its jobs behind.
async fn wait_for(
    mut child: tokio::process::Child,
    mut group: GroupGuard,
    mut kill: CancelSignal,
    timeout: Option<Duration>,
) -> Ended {
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut timed_out = false;
    let mut killed = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            () = tokio::time::sleep_until(deadline.unwrap_or(far)), if deadline.is_some() && !timed_out && !killed => {
                timed_out = true;
                group.kill();
            },
            () = kill.cancelled(), if !timed_out && !killed => {
                killed = true;
                group.kill();
            },
        }
    };
    group.disarm();
    let (exit_code, signal) = match status {
        Ok(status) => (status.code(), status.signal()),
        Err(_) => (None, None),
    };
    Ended {
        exit_code,
        signal,
        timed_out,
        killed,
    }
}

/// What the output reader saw.
#[derive(Clone, Copy, Debug, Default)]
struct Copied {
    /// Lines of output (a last line without a newline counts).
    lines: u64,
    /// Whether the file was cut (its beginning dropped).
    cut: bool,
}

/// Copies a job's output from `reader` to `file` until every writer closed it; when the file
/// would grow past `cap.max`, it is rewritten to a line saying how much was dropped and the
/// output's last `cap.keep` bytes (from a line start). A write that fails (a full disk) drops
/// the output but keeps reading, so the job never blocks on its pipe.
fn copy_capped(mut reader: impl std::io::Read, mut file: std::fs::File, cap: LogCap) -> Copied {
    use std::io::Write;
    let mut buf = vec![0u8; 64 * 1024];
    let mut copied = Copied::default();
    let mut total = 0u64;
    let mut in_file = 0u64;
    let mut last = None;
    let mut writable = true;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let chunk = &buf[..n];
        total += n as u64;
        copied.lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
        last = chunk.last().copied();
        if !writable {
            continue;
        }
        if in_file + n as u64 > cap.max {
            match cut_log(&mut file, in_file, chunk, total, cap.keep) {
                Ok(len) => {
                    in_file = len;
                    copied.cut = true;
                }
                Err(_) => writable = false,
            }
        } else if file.write_all(chunk).is_ok() {
            in_file += n as u64;
        } else {
            writable = false;
        }
    }
    copied.lines += u64::from(total > 0 && last != Some(b'\n'));
    copied
}

/// Rewrites `file` (holding `in_file` bytes) as a line saying how much was dropped, then the
/// last `keep` bytes of its content followed by `chunk`, starting at a line. `total` counts
/// every byte of output so far, `chunk` included. Returns the file's new length.
fn cut_log(
    file: &mut std::fs::File,
    in_file: u64,
    chunk: &[u8],
    total: u64,
    keep: u64,
) -> std::io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let from_chunk = chunk.len().min(keep as usize);
    let from_file = (keep - from_chunk as u64).min(in_file);
    let mut kept = vec![0u8; from_file as usize];
    file.seek(SeekFrom::Start(in_file - from_file))?;
    file.read_exact(&mut kept)?;
    kept.extend_from_slice(&chunk[chunk.len() - from_chunk..]);
    // Start at a line, unless the kept part is one long line.
    let start = match kept.iter().position(|b| *b == b'\n') {
        Some(at) if at + 1 < kept.len() => at + 1,
        _ => 0,
    };
    let kept = &kept[start..];
    let header = format!(
        "[wuhu: the first {} bytes of this job's output were dropped; its output file keeps at most the last {keep} bytes]\n",
        total - kept.len() as u64
    );
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(header.as_bytes())?;
    file.write_all(kept)?;
    Ok((header.len() + kept.len()) as u64)
}

/// Kills the jobs that runner processes which are gone left running, from their records in
/// `dir` (`<runner pid> <process group>`); a record of a runner that still runs (another
/// runner on this machine) is left alone. A process is killed only when it is that job's
/// (its environment has the job's `WUHU_JOB_ID`), so a reused process id is never hit.
/// Returns how many were killed.
fn kill_orphans(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut killed = 0;
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        let job_id = entry.file_name().to_string_lossy().into_owned();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let mut numbers = text.split_whitespace().map(str::parse::<i32>);
        let (Some(Ok(runner)), Some(Ok(group))) = (numbers.next(), numbers.next()) else {
            let _ = std::fs::remove_file(&path);
            continue;
        };
        if runner as u32 != std::process::id() && process_exists(runner) {
            continue;
        }
        if group > 0 && is_job_process(group, &job_id) {
            let mut guard = GroupGuard(Some(group));
            guard.kill();
            killed += 1;
        }
        let _ = std::fs::remove_file(&path);
    }
    killed
}

fn process_exists(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    alive || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether process `pid` runs with `WUHU_JOB_ID=<job_id>` in its environment.
fn is_job_process(pid: i32, job_id: &str) -> bool {
    let wanted = format!("WUHU_JOB_ID={job_id}");
    if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) {
        return environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes());
    }
    // Without /proc (macOS): `ps -E` shows a process's environment after its command.
    std::process::Command::new("ps")
        .args(["-ww", "-E", "-o", "command=", "-p", &pid.to_string()])
        .stderr(Stdio::null())
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .any(|w| w == wanted)
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests;
