//! Background jobs, the session's side (issue 12, `docs/orchestration.md`): what a session
//! concludes about a job it started with `bash {background: true}` from what it hears.
//!
//! A job is **running** until one of these ends it, once (a finished job never changes again):
//!
//! * its runner reports it finished (an `event`, or a `job_status` answer): `succeeded`,
//!   `failed` or `killed`, as the runner says;
//! * its runner went away: it is connected but does not know the job (the runner process died
//!   or restarted), or it stays disconnected for [`JobTimings::grace_ms`]. The job is then
//!   `failed`, with a [`JobRecord::reason`] naming the runner and how it went away (issue 12:
//!   "if the runner dies the job ends as failed, visibly").
//!
//! Each ending becomes one `wuhu_job_finished_v1` `custom_message` on the session's `system`
//! lane ([`finished_message`]), whose id is derived from the job, so hearing of the end twice
//! (event and poll) queues it once; it wakes an idle session like any other end. While any job runs, the session asks its runner about it
//! every [`JobTimings::poll_ms`] ([`next_poll`]): that is how a lost event, a dead runner or a
//! restarted one are noticed.

use serde::{Deserialize, Serialize};

use crate::session::{Millis, SystemInput};
use crate::wire::custom_types;
use crate::wire::runner::jobs::{MAX_RUNNING_PER_RUNNER, MAX_RUNNING_PER_SESSION};
use crate::wire::runner::{JobReport, JobState};

/// How often a session asks about its running jobs, unless configured.
pub const DEFAULT_POLL_MS: u64 = 15_000;
/// How long a job's runner may stay disconnected before the job fails, unless configured (a runner reconnects within 30 s of backoff).
pub const DEFAULT_GRACE_MS: u64 = 60_000;
/// Jobs a session remembers (running or finished); the oldest finished one is forgotten first,
/// and a start is refused while this many run.
pub const MAX_JOBS_KEPT: usize = 256;

/// How a deployment polls jobs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobTimings {
    /// Between two polls of a session's running jobs.
    pub poll_ms: u64,
    /// How long a runner may be away before its jobs fail.
    pub grace_ms: u64,
}

impl Default for JobTimings {
    fn default() -> Self {
        JobTimings {
            poll_ms: DEFAULT_POLL_MS,
            grace_ms: DEFAULT_GRACE_MS,
        }
    }
}

impl JobTimings {
    /// From `WUHU_JOB_RUNNER_GRACE_SECONDS` (1..=3600); the poll runs every third of the grace,
    /// at most every [`DEFAULT_POLL_MS`] and at least every second. Bad values keep the defaults.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> JobTimings {
        let grace = var("WUHU_JOB_RUNNER_GRACE_SECONDS")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|s| (1..=3600).contains(s));
        match grace {
            None => JobTimings::default(),
            Some(seconds) => JobTimings {
                poll_ms: (seconds * 1000 / 3).clamp(1000, DEFAULT_POLL_MS),
                grace_ms: seconds * 1000,
            },
        }
    }
}

/// What a session keeps about one of its jobs (also `GET /v1/sessions/:id/jobs`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct JobRecord {
    /// The runner's id for it.
    pub job_id: String,
    /// The runner it runs on.
    pub runner: String,
    /// That runner's owner.
    pub runner_owner: String,
    /// The environment it runs in (the session's name for it).
    pub environment: String,
    /// The command line (cut).
    pub command: String,
    /// Unix ms when it started.
    pub started_at_ms: u64,
    /// Where it stands.
    pub state: JobState,
    /// Since when its runner has been found disconnected (cleared when it is seen again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absent_since_ms: Option<u64>,
    /// How it ended (the runner's report, or the session's conclusion when the runner went
    /// away).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<JobReport>,
    /// Why it failed, when the session concluded it (its runner went away); `None` for an end
    /// its runner reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What the session learnt about a running job.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// The runner's report (an event, or a `job_status` answer).
    Report(JobReport),
    /// The runner is connected and does not know the job.
    Unknown,
    /// The runner is not connected.
    RunnerAbsent,
}

/// A message for the session's `system` lane.
#[derive(Clone, Debug, PartialEq)]
pub struct JobMessage {
    /// Queue item id: `job-<jobId>-finished`, so the end is queued once.
    pub id: String,
    /// The text the LLM sees.
    pub content: String,
    /// Its `custom_message` type ([`custom_types::JOB_FINISHED`]) and details (the report plus
    /// `runner` and `environment`).
    pub input: SystemInput,
}

/// What an observation changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// The job as it is now.
    pub record: JobRecord,
    /// The message to queue when the job ended.
    pub message: Option<JobMessage>,
}

/// Applies `observation` to `record` at `now`. `None`: nothing changes (a finished job, a
/// report about another job, a repeat).
pub fn observe(
    record: &JobRecord,
    observation: Observation,
    now: Millis,
    timings: JobTimings,
) -> Option<Change> {
    if record.state.is_finished() {
        return None;
    }
    let runner_gone = |why: String| {
        let mut next = record.clone();
        let report = JobReport {
            job_id: record.job_id.clone(),
            command: record.command.clone(),
            state: JobState::Failed,
            exit_code: None,
            signal: None,
            timed_out: false,
            started_at_ms: record.started_at_ms,
            duration_ms: now.0.saturating_sub(record.started_at_ms),
            total_lines: 0,
            output_tail: String::new(),
            truncated: false,
            full_output_path: None,
        };
        next.state = JobState::Failed;
        next.absent_since_ms = None;
        next.reason = Some(why);
        let message = finished_message(&next, &report);
        next.report = Some(report);
        Some(Change {
            record: next,
            message: Some(message),
        })
    };
    match observation {
        Observation::Report(report) if report.job_id != record.job_id => None,
        Observation::Report(report) if report.state == JobState::Running => {
            record.absent_since_ms.map(|_| Change {
                record: JobRecord {
                    absent_since_ms: None,
                    ..record.clone()
                },
                message: None,
            })
        }
        Observation::Report(report) => {
            let mut next = record.clone();
            next.state = report.state;
            next.absent_since_ms = None;
            let message = finished_message(&next, &report);
            next.report = Some(report);
            Some(Change {
                record: next,
                message: Some(message),
            })
        }
        Observation::Unknown => runner_gone(format!(
            "its runner {:?} went away: it is connected again but no longer knows the job (the \
             runner process died or was restarted, which ends its jobs)",
            record.runner
        )),
        Observation::RunnerAbsent => {
            let since = record.absent_since_ms.unwrap_or(now.0);
            if now.0.saturating_sub(since) >= timings.grace_ms {
                return runner_gone(format!(
                    "its runner {:?} went away: disconnected for {} s (the runner process died \
                     or lost its network)",
                    record.runner,
                    now.0.saturating_sub(since) / 1000
                ));
            }
            record.absent_since_ms.is_none().then(|| Change {
                record: JobRecord {
                    absent_since_ms: Some(since),
                    ..record.clone()
                },
                message: None,
            })
        }
    }
}

/// When the session should next ask about its jobs: a poll from `now` while any runs.
pub fn next_poll(records: &[JobRecord], now: Millis, timings: JobTimings) -> Option<Millis> {
    records
        .iter()
        .any(|r| !r.state.is_finished())
        .then_some(Millis(now.0 + timings.poll_ms))
}

/// Whether a session with `running` jobs may start another one.
///
/// # Errors
/// The refusal, in words for the model.
pub fn may_start(running: usize) -> Result<(), String> {
    if running >= MAX_RUNNING_PER_SESSION {
        return Err(format!(
            "{running} background jobs of this session are running (limit \
             {MAX_RUNNING_PER_SESSION}); wait for one to finish or kill one with job_kill"
        ));
    }
    Ok(())
}

/// Whether a runner running `on_runner` jobs, `for_session` of them for the asking session, may
/// start another one for it.
///
/// # Errors
/// The refusal, in words for the model.
pub fn runner_admits(on_runner: usize, for_session: usize) -> Result<(), String> {
    if for_session >= MAX_RUNNING_PER_SESSION {
        return Err(format!(
            "{for_session} background jobs of this session run on this runner (limit \
             {MAX_RUNNING_PER_SESSION}); wait for one to finish or kill one with job_kill"
        ));
    }
    if on_runner >= MAX_RUNNING_PER_RUNNER {
        return Err(format!(
            "{on_runner} background jobs run on this runner (limit {MAX_RUNNING_PER_RUNNER}); \
             wait for one to finish or kill one with job_kill"
        ));
    }
    Ok(())
}

/// Which remembered jobs to forget so at most [`MAX_JOBS_KEPT`] remain: the oldest finished
/// ones (running jobs are never forgotten). `records` is oldest first.
pub fn to_forget(records: &[JobRecord]) -> Vec<String> {
    let excess = records.len().saturating_sub(MAX_JOBS_KEPT);
    records
        .iter()
        .filter(|r| r.state.is_finished())
        .take(excess)
        .map(|r| r.job_id.clone())
        .collect()
}

/// The `system`-lane message for a job that ended (`record` as it is now: its
/// [`JobRecord::reason`] explains a job that failed because its runner went away).
pub fn finished_message(record: &JobRecord, report: &JobReport) -> JobMessage {
    let why = record.reason.as_deref();
    let name = format!(
        "Background job {} (`{}`) in environment {:?}",
        record.job_id, record.command, record.environment
    );
    let took = format_duration(report.duration_ms);
    let mut content = match report.state {
        JobState::Failed if why.is_some() => format!(
            "{name} failed: {}. Whether the command finished is unknown; check the environment \
             before running it again.",
            why.unwrap_or_default()
        ),
        JobState::Succeeded => format!("{name} succeeded (exit code 0) after {took}."),
        JobState::Failed if report.timed_out => {
            format!("{name} failed: it timed out after {took} and its process group was killed.")
        }
        JobState::Failed => match (report.exit_code, report.signal) {
            (Some(code), _) => format!("{name} failed with exit code {code} after {took}."),
            (None, Some(signal)) => {
                format!("{name} failed: it was killed by signal {signal} after {took}.")
            }
            (None, None) => format!("{name} failed after {took}."),
        },
        JobState::Killed => format!("{name} was killed (job_kill) after {took}."),
        JobState::Running => format!("{name} is still running ({took} so far)."),
    };
    if why.is_none() {
        if report.output_tail.is_empty() {
            content.push_str(" It printed nothing.");
        } else {
            content.push_str(if report.truncated {
                " The end of its output:\n\n"
            } else {
                " Its output:\n\n"
            });
            content.push_str(&report.output_tail);
            if report.truncated {
                if !content.ends_with('\n') {
                    content.push('\n');
                }
                content.push_str(&format!(
                    "\n[{} lines in all. The whole output is in {}: page it with read (offset, \
                     limit).]",
                    report.total_lines,
                    report.full_output_path.as_deref().unwrap_or("(not kept)")
                ));
            }
        }
    }
    let mut details = serde_json::to_value(report).unwrap_or_default();
    if let serde_json::Value::Object(map) = &mut details {
        map.insert("runner".into(), record.runner.clone().into());
        map.insert("environment".into(), record.environment.clone().into());
        if let Some(why) = why {
            map.insert("reason".into(), why.into());
        }
    }
    JobMessage {
        id: format!("job-{}-finished", record.job_id),
        content,
        input: SystemInput {
            custom_type: custom_types::JOB_FINISHED.into(),
            details: Some(details),
        },
    }
}

/// `850 ms`, `2.0 s`, `3 min 20 s`.
fn format_duration(ms: u64) -> String {
    match ms {
        0..1000 => format!("{ms} ms"),
        1000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => format!("{} min {} s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

#[cfg(test)]
mod tests;

/// The command line as a job record and its reports show it: at most 200 bytes, on one line
/// (the runner and the session keep the same text).
pub fn short_command(command: &str) -> String {
    let one_line = command.trim().replace('\n', "; ");
    if one_line.len() <= 200 {
        return one_line;
    }
    let mut end = 199;
    while !one_line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &one_line[..end])
}

/// `raw` as one safe file-name component: `[A-Za-z0-9-]` kept, anything else `_`, at most 64
/// characters, never empty (ids come from the server and name log files on a runner).
pub fn file_component(raw: &str) -> String {
    let safe: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if safe.is_empty() {
        String::from("_")
    } else {
        safe
    }
}

#[cfg(test)]
mod text_tests {
    use super::{file_component, short_command};

    #[test]
    fn short_command_is_one_line_of_at_most_200_bytes() {
        assert_eq!(short_command("  ls\npwd "), "ls; pwd");
        let long = "é".repeat(150);
        let short = short_command(&long);
        assert!(short.len() <= 200 + "…".len(), "{}", short.len());
        assert!(short.ends_with('…'));
        assert_eq!(short_command(&"a".repeat(200)), "a".repeat(200));
    }

    #[test]
    fn file_components_are_safe_and_never_empty() {
        assert_eq!(file_component("job-1a"), "job-1a");
        assert_eq!(file_component("../x/y"), "___x_y");
        assert_eq!(file_component(""), "_");
        assert_eq!(file_component(&"a".repeat(100)).len(), 64);
    }
}
