//! Background jobs: `bash {command, background: true}` answers at once with a job id and the
//! command runs on. Jobs belong to the runner **process**, not to a connection: a reconnect
//! neither kills nor forgets them, and a job that ends while the runner is disconnected is
//! reported after the next `welcome`. A runner that dies takes its jobs' records with it; the
//! session then concludes they are lost (`wuhu_core::jobs`).
//!
//! Bounds (`wuhu_core::wire::runner::jobs`): `MAX_RUNNING_PER_RUNNER` running jobs,
//! `MAX_RUNNING_PER_SESSION` per session; [`MAX_FINISHED_KEPT`] finished jobs remembered (the oldest is forgotten first, with its
//! output file). Output goes to `<log dir>/jobs/<session>/<job>.log`; the file is kept only when
//! the output is longer than the report's tail, and the session's `read` may read it (and no
//! other session's: [`crate::tools::ToolContext::job_logs`]).

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
    FINISHED_EVENT, MAX_FINISHED_KEPT, TAIL_BYTES, TAIL_LINES, UNKNOWN_JOB,
};
use wuhu_core::wire::runner::{JobReport, JobState, RunnerMessage};

use crate::tools::bash::{BashArgs, DEFAULT_PATH, NON_INTERACTIVE_ENV};
use crate::tools::{CancelHandle, CancelSignal, ToolContext, ToolOutput};

/// How long `job_kill` waits for the killed job to be reaped before it answers.
const KILL_WAIT: Duration = Duration::from_secs(5);
/// How much of the log's end is read to make the tail.
const TAIL_READ_BYTES: u64 = 4 * TAIL_BYTES as u64;

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
        Jobs {
            inner: Mutex::new(Inner::default()),
            log_dir,
            temp_root,
            seed,
        }
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

    /// Starts `args.command` as a job of `session_id` in `ctx` (its cwd and env; its temp dir
    /// and cancel signal are not used: the job gets its own). Answers at once.
    pub fn start(
        self: &Arc<Self>,
        ctx: &ToolContext,
        session_id: &str,
        environment: &str,
        args: BashArgs,
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
        let opened = std::fs::create_dir_all(&log_dir)
            .and_then(|()| std::fs::create_dir_all(&temp_dir))
            .and_then(|()| std::fs::File::create(&log_path));
        let log = match opened {
            Ok(log) => log,
            Err(e) => return ToolOutput::error(format!("cannot create the job's log file: {e}")),
        };
        let err = match log.try_clone() {
            Ok(err) => err,
            Err(e) => return ToolOutput::error(format!("cannot create the job's log file: {e}")),
        };
        let mut cmd = tokio::process::Command::new("bash");
        cmd.arg("-c")
            .arg(&args.command)
            .current_dir(&ctx.cwd)
            .env_clear()
            .envs(&ctx.env)
            .envs(NON_INTERACTIVE_ENV)
            .env("TMPDIR", &temp_dir)
            .env("WUHU_JOB_ID", &job_id)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .process_group(0)
            .kill_on_drop(true);
        if !ctx.env.contains_key("PATH") {
            cmd.env("PATH", DEFAULT_PATH);
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
        drop(cmd);
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
        tokio::spawn(async move {
            let ended = wait_for(child, kill_signal, timeout).await;
            let _ = std::fs::remove_dir_all(&temp_dir);
            // Reading the log may take a while: not under the lock, not on a runtime thread.
            let tail = tokio::task::spawn_blocking(move || read_tail(&log_path))
                .await
                .unwrap_or_default();
            jobs.finish(&id, ended, tail);
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
async fn wait_for(
    mut child: tokio::process::Child,
    mut kill: CancelSignal,
    timeout: Option<Duration>,
) -> Ended {
    let pgid = child.id().map(|pid| pid as i32);
    let kill_group = || {
        if let Some(pgid) = pgid
            && pgid > 0
        {
            // SAFETY: kill(2) with a negative pid signals the process group we created.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    };
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut timed_out = false;
    let mut killed = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            () = tokio::time::sleep_until(deadline.unwrap_or(far)), if deadline.is_some() && !timed_out && !killed => {
                timed_out = true;
                kill_group();
            },
            () = kill.cancelled(), if !timed_out && !killed => {
                killed = true;
                kill_group();
            },
        }
    };
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

#[cfg(test)]
mod tests;
