//! Background jobs, the actor's side (`docs/orchestration.md`). The rules are
//! `wuhu_core::jobs`; this module moves their inputs and outputs:
//!
//! - the `jobs` table: one row per job the session started (`bash {background: true}`), at most
//!   `wuhu_core::jobs::MAX_JOBS_KEPT`, mirrored in memory;
//! - `POST /job_event` (from the runner hub: a runner reported a job's end);
//! - the poll: while a job runs, the alarm asks its runner about it every
//!   `JobTimings::poll_ms` (`job_status`), which notices a lost event, a restarted runner or
//!   one that stays away;
//! - each ending becomes one `wuhu_job_finished_v1` message on the `system` lane, which wakes
//!   an idle session.

use std::cell::RefCell;
use std::rc::Rc;

use serde::Deserialize;
use worker::SqlStorage;
use wuhu_core::jobs::{self, Change, JobRecord, JobTimings, Observation};
use wuhu_core::session::Millis;
use wuhu_core::wire::runner::jobs::{KILL_TOOL, STATUS_TOOL, UNKNOWN_JOB};
use wuhu_core::wire::runner::{JobEvent, JobReport, RunnerMessage};

use super::{Actor, now};
use crate::http::{ApiError, ApiResult};
use crate::internal::codes;
use crate::runner_client;
use crate::tool_context::Jobs;

/// The `jobs` table and its copy in memory (oldest first).
pub(crate) struct JobStore {
    sql: SqlStorage,
    records: RefCell<Vec<JobRecord>>,
}

#[derive(Deserialize)]
struct Row {
    record: String,
}

impl JobStore {
    pub(crate) fn open(sql: SqlStorage) -> worker::Result<JobStore> {
        sql.exec(
            "CREATE TABLE IF NOT EXISTS jobs (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, record TEXT NOT NULL)",
            None,
        )?;
        let rows: Vec<Row> = sql
            .exec("SELECT record FROM jobs ORDER BY seq", None)?
            .to_array()?;
        let records = rows
            .into_iter()
            .filter_map(|r| serde_json::from_str(&r.record).ok())
            .collect();
        Ok(JobStore {
            sql,
            records: RefCell::new(records),
        })
    }

    pub(crate) fn list(&self) -> Vec<JobRecord> {
        self.records.borrow().clone()
    }

    fn get(&self, id: &str) -> Option<JobRecord> {
        self.records
            .borrow()
            .iter()
            .find(|r| r.job_id == id)
            .cloned()
    }

    /// Stores `record` (new or changed); forgets the oldest finished jobs beyond the bound.
    fn put(&self, record: &JobRecord) -> worker::Result<()> {
        let json =
            serde_json::to_string(record).map_err(|e| worker::Error::RustError(e.to_string()))?;
        self.sql.exec(
            "INSERT INTO jobs (id, record) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET record = excluded.record",
            vec![record.job_id.as_str().into(), json.into()],
        )?;
        let mut records = self.records.borrow_mut();
        match records.iter_mut().find(|r| r.job_id == record.job_id) {
            Some(known) => *known = record.clone(),
            None => records.push(record.clone()),
        }
        for id in jobs::to_forget(&records) {
            self.sql
                .exec("DELETE FROM jobs WHERE id = ?", vec![id.as_str().into()])?;
            records.retain(|r| r.job_id != id);
        }
        Ok(())
    }
}

/// What a tool sees of the session's jobs ([`Jobs`]).
pub(super) struct ActorJobs {
    pub(super) actor: Rc<Actor>,
}

impl Jobs for ActorJobs {
    fn get(&self, id: &str) -> Option<JobRecord> {
        self.actor
            .jobs
            .job_store
            .as_ref()
            .ok()
            .and_then(|s| s.get(id))
    }

    fn running(&self) -> usize {
        self.actor
            .jobs
            .job_store
            .as_ref()
            .map(|s| s.list().iter().filter(|r| !r.state.is_finished()).count())
            .unwrap_or(0)
    }

    fn record(&self, record: JobRecord) -> Result<(), String> {
        let store = self.actor.jobs.job_store.as_ref().map_err(|e| e.clone())?;
        store.put(&record).map_err(|e| e.to_string())?;
        self.actor.schedule_job_poll();
        Ok(())
    }
}

/// What a runner's answer to `job_status` / `job_kill` says about the job.
pub(crate) fn observation_of(answer: &RunnerMessage) -> Option<Observation> {
    let RunnerMessage::ToolResult {
        content, details, ..
    } = answer
    else {
        return None;
    };
    let details = details.as_ref()?;
    if details.get(UNKNOWN_JOB).and_then(|v| v.as_bool()) == Some(true) {
        return Some(Observation::Unknown);
    }
    let mut report: JobReport = serde_json::from_value(details.get("job")?.clone()).ok()?;
    // The answer's content is the output's tail after a summary line.
    if report.state.is_finished() && report.output_tail.is_empty() {
        report.output_tail = content
            .split_once("\n\n")
            .map(|(_, tail)| tail.to_string())
            .unwrap_or_default();
    }
    Some(Observation::Report(report))
}

impl Actor {
    fn job_timings(&self) -> JobTimings {
        JobTimings::from_vars(|name| self.env.var(name).ok().map(|v| v.to_string()))
    }

    /// Makes sure the alarm fires for the next poll while a job runs: keeps a poll already
    /// scheduled (so frequent calls do not push it back), else schedules one.
    pub(super) fn schedule_job_poll(self: &Rc<Self>) {
        let Ok(store) = self.jobs.job_store.as_ref() else {
            return;
        };
        let Some(next) = jobs::next_poll(&store.list(), now(), self.job_timings()) else {
            self.jobs.job_poll_at.set(None);
            return;
        };
        let at = match self.jobs.job_poll_at.get() {
            Some(at) if at > now().0 => at,
            _ => next.0,
        };
        self.jobs.job_poll_at.set(Some(at));
        self.arm_alarm_by(Millis(at));
    }

    /// Applies what was learnt of a job: queues its ending on the `system` lane (once: the
    /// message id is the job's) and, once that is committed, stores the record. So an ending is
    /// never recorded without its message: a crash or a failed commit between the two leaves the
    /// job `running`, the next poll learns of its end again, and the session takes the same
    /// message id once (`Session::handle_system_message`).
    async fn apply_job_change(self: &Rc<Self>, mut change: Change) -> ApiResult<()> {
        let store = self
            .jobs
            .job_store
            .as_ref()
            .map_err(|e| ApiError::internal(format!("storage unavailable: {e}")))?;
        // A job's output tail is the runner's: masked like any tool output, before it is kept.
        let masker = self.masker();
        if let Some(report) = &mut change.record.report {
            report.output_tail = masker.mask(&report.output_tail).into_owned();
        }
        if let Some(mut message) = change.message {
            message.content = masker.mask(&message.content).into_owned();
            if let Some(details) = &mut message.input.details {
                masker.mask_json(details);
            }
            self.with_session(|s| {
                s.handle_system_message(now(), message.id, message.input, message.content)
            })
            .ok_or_else(|| ApiError::internal("session not loaded"))?
            .map_err(|e| ApiError::new(429, "queue_full", e.to_string()))?;
            self.pump().wait().await?;
        }
        store.put(&change.record)?;
        Ok(())
    }

    /// `POST /job_event`: the hub forwards a runner's report. Heeded only for a job this
    /// session started on that runner; anything else is a 404.
    pub(super) async fn job_event(self: &Rc<Self>, event: JobEvent) -> ApiResult<bool> {
        let store = self
            .jobs
            .job_store
            .as_ref()
            .map_err(|e| ApiError::internal(format!("storage unavailable: {e}")))?;
        let record = store
            .get(&event.report.job_id)
            .filter(|r| r.runner == event.runner && r.runner_owner == event.runner_owner)
            .ok_or_else(|| ApiError::not_found("no job with this id from this runner"))?;
        let Some(change) = jobs::observe(
            &record,
            Observation::Report(event.report),
            now(),
            self.job_timings(),
        ) else {
            return Ok(false);
        };
        self.apply_job_change(change).await?;
        Ok(true)
    }

    /// The session was stopped: its running jobs are killed (`job_kill` on their runners), and
    /// each ends as `killed` with its `wuhu_job_finished_v1` message (queued: a stopped session
    /// stays stopped until someone resumes it). A job whose runner cannot be reached now is
    /// left to the poll (it fails when the runner stays away).
    pub(super) async fn kill_jobs(self: &Rc<Self>) {
        self.ask_running_jobs(KILL_TOOL).await;
    }

    /// The alarm's poll: asks each running job's runner how it stands and applies the answer.
    pub(super) async fn poll_jobs(self: &Rc<Self>) {
        self.ask_running_jobs(STATUS_TOOL).await;
    }

    /// Asks each running job's runner `tool` (`job_status` or `job_kill`) and applies the
    /// answer.
    async fn ask_running_jobs(self: &Rc<Self>, tool: &str) {
        let Ok(store) = self.jobs.job_store.as_ref() else {
            return;
        };
        let timings = self.job_timings();
        let running: Vec<JobRecord> = store
            .list()
            .into_iter()
            .filter(|r| !r.state.is_finished())
            .collect();
        if running.is_empty() {
            return;
        }
        let tenant = self.tenant();
        let owner = self.owner();
        let session_id = self.session_id();
        for record in running {
            let answer =
                runner_client::ask_job(&self.env, &tenant, &owner, &session_id, &record, tool)
                    .await;
            let observation = match &answer {
                Ok(answer) => observation_of(answer),
                Err(e)
                    if e.code == codes::RUNNER_NOT_CONNECTED
                        || e.code == codes::RUNNER_DISCONNECTED =>
                {
                    Some(Observation::RunnerAbsent)
                }
                Err(e) => {
                    worker::console_error!(
                        "asking runner {:?} about job {} failed ({}): {}",
                        record.runner,
                        record.job_id,
                        e.code,
                        e.message
                    );
                    None
                }
            };
            // The record may have changed while the runner was asked (an event arrived).
            let Some(current) = store.get(&record.job_id) else {
                continue;
            };
            let Some(change) = observation.and_then(|o| jobs::observe(&current, o, now(), timings))
            else {
                continue;
            };
            if let Err(e) = self.apply_job_change(change).await {
                worker::console_error!("recording job {} failed: {}", record.job_id, e.message);
            }
        }
        self.schedule_job_poll();
    }
}
