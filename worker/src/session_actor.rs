//! `SessionActor`: one Durable Object per session. The actor owns the `Session` (rules in
//! `wuhu-core`); the modules below only move bytes and perform effects.
//!
//! Each handler follows one pattern: decode → `session.handle_*` → [`Actor::pump`] (commit the
//! new entries, queue rows and checkpoint in one transaction, then perform the other effects:
//! start inference, run tools, notify followers, arm the alarm).
//!
//! - [`routes`]: the internal routes (reached only through the router, which has already
//!   authenticated; identity arrives in `x-wuhu-tenant` / `x-wuhu-sub`): `POST /init`,
//!   `GET /info`, `GET /transcript`, `POST /enqueue`, `POST /cancel`, `POST /approval`,
//!   `POST /stop`, `POST /title`, `GET /follow`, `GET /socket` (a client WebSocket, [`socket`]),
//!   `GET /stats`, `DELETE /delete`; between actors
//!   only `POST /child_event`, `POST /child_input`, `POST /start`, `POST /dispose`; from the
//!   runner hub only `POST /job_event`.
//! - [`persist`]: loading, and committing each drain before it is performed (durability rules);
//!   [`store`] is its SQLite schema, [`blob_io`] the out-of-line objects in R2.
//! - [`effects`]: performing a committed drain (followers, tasks, alarm, index, flush).
//! - [`tasks`]: inference and tool tasks under abort handles; [`inference`] and [`tools`] are
//!   what those tasks run.
//! - [`approvals`]: stored approvals and the gate a tool call waits at.
//! - [`children`]: child sessions: the parent's `children` table and `/child_event`, a child's
//!   lifecycle reports, its input through the concurrency gate (`/child_input`, `/start`), and
//!   the stop cascade.
//! - [`jobs`]: background jobs: the `jobs` table, `/job_event` from the runner hub, the poll
//!   of running jobs from the alarm, their endings on the `system` lane.
//! - [`archive`]: flushing to R2 and reading contiguous pages; [`follow`]: the follow stream.
//! - [`deletion`]: deleting the session: the mark, then the steps of `wuhu_core::deletion`.
//!
//! No module outside this folder imports the actor: tools get a complete
//! [`crate::tool_context::ToolContext`] instead.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use worker::{
    Date, DurableObject, Env, Request, Response, State, WebSocket, WebSocketIncomingMessage,
    durable_object,
};
use wuhu_core::approvals::Outcome;
use wuhu_core::context::ContextWindow;
use wuhu_core::environments::Attachment;
use wuhu_core::session::{Millis, Phase, Session};
use wuhu_core::wire::{QueueItemInfo, SessionInfo, Status, StreamEvent};

use crate::http::{ApiError, ApiResult};
use crate::runner_calls::RunnerCalls;
use approvals::ApprovalStore;
use store::{RawStorage, SessionMeta, Store};

mod approvals;
mod archive;
mod blob_io;
mod children;
mod choice;
mod deletion;
mod effects;
mod follow;
mod inference;
mod jobs;
mod persist;
mod routes;
mod socket;
mod store;
mod tasks;
mod tools;
/// How long a running session may go without progress before the alarm checks on it.
const WATCHDOG: Duration = Duration::from_secs(30);

#[durable_object]
pub struct SessionActor {
    actor: Rc<Actor>,
}

/// The actor's shared state. Borrows of its `RefCell`s never cross an `.await`.
pub(crate) struct Actor {
    pub(crate) state: State,
    pub(crate) env: Env,
    store: Result<Store, String>,
    loaded: RefCell<Option<Loaded>>,
    pub(crate) followers: RefCell<follow::Followers>,
    /// The open client sockets were re-registered in this isolate (`socket`).
    sockets_revived: Cell<bool>,
    /// Inference and tool tasks running in this isolate, each with its abort handle. None
    /// after a restart.
    tasks: tasks::Tasks,
    /// `tool_call`s sent to runners and not answered yet (also in SQLite, for restarts).
    runner_calls: Rc<RunnerCalls>,
    pub(crate) flushing: Cell<bool>,
    /// When the session last became idle (`None` while a turn runs): the idle flush waits on it
    /// (`wuhu_core::bookkeeping`).
    idle_since: Cell<Option<u64>>,
    /// An idle-flush timer is sleeping.
    idle_flush_timer: Cell<bool>,
    index_dirty: Cell<bool>,
    index_sending: Cell<bool>,
    /// Usage to report to the tenant index, and whether a report is being sent.
    usage_dirty: Cell<bool>,
    usage_sending: Cell<bool>,
    /// Steps waiting for the report in flight (`Actor::usage_report_sent`).
    usage_waiters: RefCell<Vec<futures::channel::oneshot::Sender<()>>>,
    /// Wakes a report waiting out `tenant_usage::USAGE_REPORT_DELAY_MS` (a step that must
    /// report first does not wait for the delay).
    usage_wake: RefCell<Option<futures::channel::oneshot::Sender<()>>>,
    /// The tenant's budget was spent when last asked (enqueue asks again while it is).
    pub(crate) tenant_budget_spent: Cell<bool>,
    /// The tenant's budget as its index last answered this actor (a usage report's answer or
    /// a question's): a step asks again only when `tenant_usage::must_ask_budget` says so, and
    /// neither reports nor asks while `tenant_usage::unlimited_and_told` holds.
    pub(crate) known_budget: Cell<Option<wuhu_core::tenant_usage::KnownBudget>>,
    /// The tenant's settings as last read (parsed), kept while the tenant's index holds this
    /// actor (it tells it of every change): a step uses them without reading R2
    /// (`inference::settings`, decision 0021).
    pub(crate) settings: RefCell<wuhu_core::tenant_config::SettingsCache<Rc<inference::Settings>>>,
    /// The reading of the tenant's settings the latest step (or check) used, kept or not: what
    /// the step's tools check a model against (`set_model`, `spawn_session {model}`).
    pub(crate) last_settings: RefCell<Option<Rc<inference::Settings>>>,
    /// Entries through this cursor were looked at for usage (the stored cursor marks only
    /// those reported).
    pub(crate) usage_scanned_through: Cell<u64>,
    /// Usage reported through this cursor, not stored yet: the next commit stores it. Until
    /// then a restart reads those entries again and reports them again, and the index counts
    /// each record once (`tenant_usage::apply_report`), so a turn's end costs no commit of its
    /// own for the report.
    pub(crate) usage_reported_unsaved: Cell<Option<u64>>,
    /// When this actor last deleted its session's expired request logs (unix ms; 0: never).
    pub(crate) llm_logs_swept_at: Cell<u64>,
    alarm_armed_for: Cell<Option<u64>>,
    /// When the running turn started in this isolate (for the turn log line).
    turn_started_at: Cell<Option<u64>>,
    /// Images the running turn's requests found in the isolate's cache and read from R2 (for
    /// the turn log line).
    turn_image_loads: Cell<crate::blob_store::ImageLoads>,
    /// The context window; `None` until first needed.
    tail: RefCell<Option<ContextWindow>>,
    /// Count and bytes of entries not archived yet; `None` when unknown.
    unarchived: Cell<Option<(u64, u64)>>,
    /// Attached environments (persisted in `meta`).
    attachments: RefCell<Vec<Attachment>>,
    /// Runner connection epoch on which each environment's snapshot was validated. Empty after a
    /// restart, so the first call after a resume validates (seed 004).
    validated: RefCell<HashMap<String, u64>>,
    /// Approvals (SQLite tables of their own).
    approval_store: Result<ApprovalStore, String>,
    /// The children this session spawned (a table of its own).
    child_store: Result<children::ChildStore, String>,
    /// The background jobs this session started (a table of its own).
    job_store: Result<jobs::JobStore, String>,
    /// The mark of a deletion in progress (a table of its own; `deletion`).
    deletion_store: Result<deletion::DeletionStore, String>,
    /// The session was marked for deletion in this isolate: no write is committed any more.
    deleting: Cell<bool>,
    /// A request or the alarm is performing the deletion's steps.
    deletion_running: Cell<bool>,
    /// A deletion dropped the storage in this isolate: its tables are gone.
    storage_dropped: Cell<bool>,
    /// When the alarm next asks about running jobs (ms); `None` when not scheduled in this
    /// isolate (the alarm then asks at once if a job runs).
    job_poll_at: Cell<Option<u64>>,
    /// Wakes the tool call waiting for each pending approval, by approval id. Empty after a
    /// restart until the resumed calls wait again; the stored approval is the truth.
    approval_waiters: RefCell<HashMap<String, futures::channel::oneshot::Sender<Outcome>>>,
    /// Drained batches waiting for the writer task, oldest first.
    pending_writes: RefCell<std::collections::VecDeque<persist::Batch>>,
    /// Whether the writer task runs (then every new batch queues behind it).
    writing: Cell<bool>,
    /// Told when the writer task has committed every batch waiting (or one failed).
    settle_waiters: RefCell<Vec<futures::channel::oneshot::Sender<ApiResult<()>>>>,
    /// Successful commits so far (to notice one that happened during an await).
    commits: Cell<u64>,
    /// The newest cursor in storage. Readers use it, not the session's last cursor, which runs
    /// ahead while a drain waits for an out-of-line write.
    committed_cursor: Cell<u64>,
    /// Consecutive failed writes (backoff of the reload).
    write_failures: Cell<u32>,
    /// Why the last write failed; recorded as a notice when the session is reloaded.
    storage_failure: RefCell<Option<String>>,
}

pub(crate) struct Loaded {
    pub(crate) session: Session,
    pub(crate) meta: SessionMeta,
}

pub(crate) fn now() -> Millis {
    Millis(Date::now().as_millis())
}

fn seed() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = getrandom::getrandom(&mut bytes);
    u64::from_le_bytes(bytes) ^ Date::now().as_millis()
}

impl DurableObject for SessionActor {
    fn new(state: State, env: Env) -> Self {
        // workers-rs binds no `transactionSync`: keep the raw storage object for it.
        let raw_state = state._inner();
        let raw_storage = raw_state
            .storage()
            .map(wasm_bindgen::JsCast::unchecked_into::<RawStorage>);
        let state = State::from(raw_state);
        let store = raw_storage
            .map_err(|_| worker::Error::RustError("no storage".into()))
            .and_then(|raw| Store::open(state.storage().sql(), raw))
            .map_err(|e| e.to_string());
        let approval_store = ApprovalStore::open(state.storage().sql()).map_err(|e| e.to_string());
        let child_store =
            children::ChildStore::open(state.storage().sql()).map_err(|e| e.to_string());
        let runner_calls = Rc::new(RunnerCalls::open(state.storage().sql()));
        let job_store = jobs::JobStore::open(state.storage().sql()).map_err(|e| e.to_string());
        let deletion_store =
            deletion::DeletionStore::open(state.storage().sql()).map_err(|e| e.to_string());
        let actor = Actor {
            state,
            env,
            store,
            loaded: RefCell::new(None),
            followers: RefCell::new(follow::Followers::default()),
            sockets_revived: Cell::new(false),
            tasks: tasks::Tasks::default(),
            runner_calls,
            flushing: Cell::new(false),
            idle_since: Cell::new(None),
            idle_flush_timer: Cell::new(false),
            index_dirty: Cell::new(false),
            index_sending: Cell::new(false),
            usage_dirty: Cell::new(false),
            usage_sending: Cell::new(false),
            usage_waiters: RefCell::new(Vec::new()),
            usage_wake: RefCell::new(None),
            tenant_budget_spent: Cell::new(false),
            known_budget: Cell::new(None),
            settings: RefCell::default(),
            last_settings: RefCell::default(),
            usage_scanned_through: Cell::new(0),
            usage_reported_unsaved: Cell::new(None),
            llm_logs_swept_at: Cell::new(0),
            alarm_armed_for: Cell::new(None),
            turn_started_at: Cell::new(None),
            turn_image_loads: Cell::new(Default::default()),
            tail: RefCell::new(None),
            unarchived: Cell::new(None),
            attachments: RefCell::new(Vec::new()),
            validated: RefCell::new(HashMap::new()),
            approval_store,
            child_store,
            job_store,
            deletion_store,
            deleting: Cell::new(false),
            deletion_running: Cell::new(false),
            storage_dropped: Cell::new(false),
            job_poll_at: Cell::new(None),
            approval_waiters: RefCell::new(HashMap::new()),
            pending_writes: RefCell::new(std::collections::VecDeque::new()),
            writing: Cell::new(false),
            settle_waiters: RefCell::new(Vec::new()),
            commits: Cell::new(0),
            committed_cursor: Cell::new(0),
            write_failures: Cell::new(0),
            storage_failure: RefCell::new(None),
        };
        SessionActor {
            actor: Rc::new(actor),
        }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        // A request may start a turn: sockets from before a hibernation follow it.
        self.actor.revive_sockets();
        Ok(match self.actor.clone().route(req).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        })
    }

    async fn websocket_message(
        &self,
        ws: WebSocket,
        message: WebSocketIncomingMessage,
    ) -> worker::Result<()> {
        self.actor.socket_frame(&ws, message).await;
        Ok(())
    }

    async fn websocket_close(
        &self,
        ws: WebSocket,
        _code: usize,
        _reason: String,
        _was_clean: bool,
    ) -> worker::Result<()> {
        self.actor.socket_closed(&ws);
        Ok(())
    }

    async fn websocket_error(&self, ws: WebSocket, _error: worker::Error) -> worker::Result<()> {
        self.actor.socket_closed(&ws);
        Ok(())
    }

    async fn alarm(&self) -> worker::Result<Response> {
        let actor = self.actor.clone();
        actor.revive_sockets();
        actor.alarm_armed_for.set(None);
        // A session marked for deletion only finishes its deletion.
        match actor.deletion_mark() {
            Ok(Some(_)) => {
                actor.finish_deletion().await;
                return Response::ok("ok");
            }
            Ok(None) => {}
            Err(e) => worker::console_error!("reading the deletion mark failed: {}", e.message),
        }
        // Loading a session whose checkpoint shows work in flight resumes it. A load that fails
        // (a write failed and storage is still unwell) is retried: nothing else may come.
        let loaded = actor.ensure_loaded();
        if let Err(e) = &loaded {
            worker::console_error!("reloading the session failed: {}", e.message);
            actor.arm_alarm(Millis(now().0 + WATCHDOG.as_millis() as u64));
        }
        if let Ok(true) = loaded {
            approvals::expire_due(&actor);
            if actor.tasks.count() == 0 {
                // No task runs, yet the session may wait for one: its task died without taking
                // the isolate with it. Resume as after a restart, so it never stays `running`.
                let stranded = actor.with_loaded(|l| {
                    matches!(
                        l.session.checkpoint().phase,
                        Phase::Inference { .. } | Phase::Tools { .. }
                    )
                }) == Some(true);
                if stranded {
                    tasks::cancel_orphans(&actor);
                    actor.with_session(|s| s.handle_resume(now()));
                } else {
                    actor.with_session(|s| s.handle_timeout(now()));
                }
                actor.pump();
            } else if actor.status() == Some(Status::Running) {
                actor.arm_alarm(Millis(now().0 + WATCHDOG.as_millis() as u64));
            }
            if let Ok(Some(at)) = actor.approval_store().and_then(|s| Ok(s.next_expiry()?)) {
                actor.arm_alarm_by(at);
            }
            // A child whose input waits for a slot asks the gate again (a `/start` may be lost).
            if let Err(e) = actor.start_pending().await {
                worker::console_error!("asking the gate again failed: {}", e.message);
            }
            // Running background jobs are asked about when their poll is due (at once in a
            // fresh isolate, which does not know when the last poll was).
            if actor.job_poll_at.get().is_none_or(|at| at <= now().0 + 500) {
                actor.job_poll_at.set(None);
                actor.poll_jobs().await;
            } else {
                actor.schedule_job_poll();
            }
        }
        Response::ok("ok")
    }
}

impl Actor {
    /// The session's owner: the first user who prompted it, its creator until then.
    pub(crate) fn owner(&self) -> String {
        self.with_loaded(|l| l.session.owner().unwrap_or(&l.meta.created_by).to_string())
            .unwrap_or_default()
    }

    pub(crate) fn store(&self) -> ApiResult<&Store> {
        self.store
            .as_ref()
            .map_err(|e| ApiError::internal(format!("storage unavailable: {e}")))
    }

    /// The newest cursor committed to storage (see `committed_cursor`).
    pub(crate) fn committed_cursor(&self) -> u64 {
        self.committed_cursor.get()
    }

    pub(crate) fn with_session<T>(&self, f: impl FnOnce(&mut Session) -> T) -> Option<T> {
        self.loaded
            .borrow_mut()
            .as_mut()
            .map(|loaded| f(&mut loaded.session))
    }

    pub(crate) fn with_loaded<T>(&self, f: impl FnOnce(&Loaded) -> T) -> Option<T> {
        self.loaded.borrow().as_ref().map(f)
    }

    pub(crate) fn status(&self) -> Option<Status> {
        self.with_loaded(|l| l.session.status())
    }

    /// Whether `step` is still the inference the session waits for.
    pub(crate) fn inference_current(&self, step: u64) -> bool {
        self.with_loaded(|l| matches!(l.session.checkpoint().phase, Phase::Inference { step: s, .. } if s == step))
            .unwrap_or(false)
    }

    pub(crate) fn info(&self) -> ApiResult<SessionInfo> {
        self.with_loaded(|l| SessionInfo {
            id: l.meta.id.clone(),
            title: l.meta.title.clone(),
            provider: l.meta.header.provider.clone(),
            model: l.meta.header.model.clone(),
            status: l.session.status(),
            created_by: l.meta.created_by.clone(),
            owner: l.session.owner().unwrap_or(&l.meta.created_by).to_string(),
            access: l.meta.access,
            created_at: l.meta.created_at,
            updated_at: l.meta.updated_at,
            last_cursor: l.session.last_cursor(),
            parent_id: l.meta.lineage.parent_id.clone(),
            depth: l.meta.lineage.depth,
            forked_from: l.meta.forked_from.clone(),
        })
        .ok_or_else(|| ApiError::not_found("session not found"))
    }

    fn queue_info(&self) -> Vec<QueueItemInfo> {
        self.with_loaded(|l| {
            l.session
                .queue()
                .iter()
                .map(|item| QueueItemInfo {
                    id: item.id.clone(),
                    lane: item.lane,
                    author: item.author.clone(),
                    content: item.content.clone(),
                    enqueued_at: item.enqueued_at,
                })
                .collect()
        })
        .unwrap_or_default()
    }

    pub(crate) fn broadcast(&self, event: StreamEvent) {
        self.followers.borrow_mut().send(&event);
    }

    /// Attached environments, for the API.
    pub(crate) fn attachments(&self) -> Vec<Attachment> {
        self.attachments.borrow().clone()
    }

    pub(crate) fn tenant(&self) -> String {
        info_tenant(self)
    }

    pub(crate) fn session_id(&self) -> String {
        self.with_loaded(|l| l.meta.id.clone()).unwrap_or_default()
    }
}

fn info_tenant(actor: &Actor) -> String {
    actor
        .with_loaded(|l| l.meta.tenant.clone())
        .unwrap_or_default()
}
