//! The session actor's state in parts, one per job (issue 31): the actor holds one of each.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use wuhu_core::approvals::Outcome;
use wuhu_core::context::ContextWindow;
use wuhu_core::environments::Attachment;

use super::{ApprovalStore, deletion, follow, inference, jobs, persist, tasks};
use crate::http::ApiResult;
use crate::runner_calls::RunnerCalls;

/// The writer: batches drained from the session wait here for their commit (`persist`), and what the
/// last commits left behind.
#[derive(Default)]
pub(super) struct Writes {
    /// Drained batches waiting for the writer task, oldest first.
    pub(super) pending_writes: RefCell<std::collections::VecDeque<persist::Batch>>,
    /// Whether the writer task runs (then every new batch queues behind it).
    pub(super) writing: Cell<bool>,
    /// Told when the writer task has committed every batch waiting (or one failed).
    pub(super) settle_waiters: RefCell<Vec<futures::channel::oneshot::Sender<ApiResult<()>>>>,
    /// Successful commits so far (to notice one that happened during an await).
    pub(super) commits: Cell<u64>,
    /// The newest cursor in storage. Readers use it, not the session's last cursor, which runs
    /// ahead while a drain waits for an out-of-line write.
    pub(super) committed_cursor: Cell<u64>,
    /// Consecutive failed writes (backoff of the reload).
    pub(super) write_failures: Cell<u32>,
    /// Why the last write failed; recorded as a notice when the session is reloaded.
    pub(super) storage_failure: RefCell<Option<String>>,
    pub(super) flushing: Cell<bool>,
    /// Count and bytes of entries not archived yet; `None` when unknown.
    pub(super) unarchived: Cell<Option<(u64, u64)>>,
}

/// What the actor tells other actors in the background and when (`wuhu_core::bookkeeping`): the
/// idle flush, the index row, usage reports and the tenant's budget, the request-log sweep, the
/// alarm.
#[derive(Default)]
pub(super) struct Bookkeeping {
    /// When the session last became idle (`None` while a turn runs): the idle flush waits on it
    /// (`wuhu_core::bookkeeping`).
    pub(super) idle_since: Cell<Option<u64>>,
    /// An idle-flush timer is sleeping.
    pub(super) idle_flush_timer: Cell<bool>,
    pub(super) index_dirty: Cell<bool>,
    pub(super) index_sending: Cell<bool>,
    /// Usage to report to the tenant index, and whether a report is being sent.
    pub(super) usage_dirty: Cell<bool>,
    pub(super) usage_sending: Cell<bool>,
    /// Steps waiting for the report in flight (`Actor::usage_report_sent`).
    pub(super) usage_waiters: RefCell<Vec<futures::channel::oneshot::Sender<()>>>,
    /// Wakes a report waiting out `tenant_usage::USAGE_REPORT_DELAY_MS` (a step that must
    /// report first does not wait for the delay).
    pub(super) usage_wake: RefCell<Option<futures::channel::oneshot::Sender<()>>>,
    /// Entries through this cursor were looked at for usage (the stored cursor marks only
    /// those reported).
    pub(super) usage_scanned_through: Cell<u64>,
    /// Usage reported through this cursor, not stored yet: the next commit stores it. Until
    /// then a restart reads those entries again and reports them again, and the index counts
    /// each record once (`tenant_usage::apply_report`), so a turn's end costs no commit of its
    /// own for the report.
    pub(super) usage_reported_unsaved: Cell<Option<u64>>,
    /// The tenant's budget was spent when last asked (enqueue asks again while it is).
    pub(super) tenant_budget_spent: Cell<bool>,
    /// The tenant's budget as its index last answered this actor (a usage report's answer or
    /// a question's): a step asks again only when `tenant_usage::must_ask_budget` says so, and
    /// neither reports nor asks while `tenant_usage::unlimited_and_told` holds.
    pub(super) known_budget: Cell<Option<wuhu_core::tenant_usage::KnownBudget>>,
    /// When this actor last deleted its session's expired request logs (unix ms; 0: never).
    pub(super) llm_logs_swept_at: Cell<u64>,
    pub(super) alarm_armed_for: Cell<Option<u64>>,
}

/// The tenant's settings as this actor read them (decision 0021).
#[derive(Default)]
pub(super) struct TenantSettings {
    /// The tenant's settings as last read (parsed), kept while the tenant's index holds this
    /// actor (it tells it of every change): a step uses them without reading R2
    /// (`inference::settings`, decision 0021).
    pub(super) settings: RefCell<wuhu_core::tenant_config::SettingsCache<Rc<inference::Settings>>>,
    /// The reading of the tenant's settings the latest step (or check) used, kept or not: what
    /// the step's tools check a model against (`set_model`, `spawn_session {model}`).
    pub(super) last_settings: RefCell<Option<Rc<inference::Settings>>>,
}

/// The running turn in this isolate, and the context window it works on.
#[derive(Default)]
pub(super) struct Turn {
    /// When the running turn started in this isolate (for the turn log line).
    pub(super) turn_started_at: Cell<Option<u64>>,
    /// Images the running turn's requests found in the isolate's cache and read from R2 (for
    /// the turn log line).
    pub(super) turn_image_loads: Cell<crate::blob_store::ImageLoads>,
    /// The context window; `None` until first needed.
    pub(super) tail: RefCell<Option<ContextWindow>>,
}

/// The session's environments and what this isolate knows of their runners.
#[derive(Default)]
pub(super) struct Environments {
    /// Attached environments (persisted in `meta`).
    pub(super) attachments: RefCell<Vec<Attachment>>,
    /// Runner connection epoch on which each environment's snapshot was validated, stored with
    /// the attachments (`store::load_validated`): an eviction forgets nothing; a reconnected
    /// runner has a new epoch, so its next call validates again (seed 004).
    pub(super) validated: RefCell<HashMap<String, u64>>,
}

/// Approvals: stored, and the tool calls waiting for them.
pub(super) struct Approvals {
    /// Approvals (SQLite tables of their own).
    pub(super) approval_store: Result<ApprovalStore, String>,
    /// Wakes the tool call waiting for each pending approval, by approval id. Empty after a
    /// restart until the resumed calls wait again; the stored approval is the truth.
    pub(super) approval_waiters:
        RefCell<HashMap<String, futures::channel::oneshot::Sender<Outcome>>>,
}

/// Background jobs: stored, and when the alarm asks about them.
pub(super) struct JobState {
    /// The background jobs this session started (a table of its own).
    pub(super) job_store: Result<jobs::JobStore, String>,
    /// When the alarm next asks about running jobs (ms); `None` when not scheduled in this
    /// isolate (the alarm then asks at once if a job runs).
    pub(super) job_poll_at: Cell<Option<u64>>,
}

/// A deletion of the session: its mark and how far it went in this isolate.
pub(super) struct DeletionState {
    /// The mark of a deletion in progress (a table of its own; `deletion`).
    pub(super) deletion_store: Result<deletion::DeletionStore, String>,
    /// The session was marked for deletion in this isolate: no write is committed any more.
    pub(super) deleting: Cell<bool>,
    /// A request or the alarm is performing the deletion's steps.
    pub(super) deletion_running: Cell<bool>,
    /// A deletion dropped the storage in this isolate: its tables are gone.
    pub(super) storage_dropped: Cell<bool>,
}

/// The people following the session: their streams and sockets.
#[derive(Default)]
pub(super) struct Clients {
    pub(super) followers: RefCell<follow::Followers>,
    /// The open client sockets were re-registered in this isolate (`socket`).
    pub(super) sockets_revived: Cell<bool>,
}

/// Work running for the session in this isolate.
pub(super) struct InFlight {
    /// Inference and tool tasks running in this isolate, each with its abort handle. None
    /// after a restart.
    pub(super) tasks: tasks::Tasks,
    /// `tool_call`s sent to runners and not answered yet (also in SQLite, for restarts).
    pub(super) runner_calls: Rc<RunnerCalls>,
}

/// A child's lifecycle outbox in this isolate (the rows are in SQLite: `children`), and a
/// parent's records of its children waiting for the next commit.
#[derive(Default)]
pub(super) struct Lifecycle {
    /// Records of children that reports changed, written with the next drain's commit (with the
    /// message a report queues).
    pub(super) pending_children: RefCell<Vec<wuhu_core::wire::ChildStatus>>,
    /// The delivery task runs.
    pub(super) outbox_sending: Cell<bool>,
    /// When the outbox's head is next due (ms), while rows wait: the alarm fires by then.
    pub(super) outbox_next_at: Cell<Option<u64>>,
    /// A test-only fault point was reached (`faults::FAULT_VAR`): this actor does nothing
    /// more in this isolate, as if it were lost there.
    pub(super) frozen: Cell<bool>,
    /// The child's environment is being made (`children::construct`): a second grant waits
    /// for that one instead of making it twice.
    pub(super) constructing: Cell<bool>,
}
