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
mod faults;
mod follow;
mod inference;
mod jobs;
mod parts;
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

/// The actor's shared state, in parts by job (`parts`). Borrows of its `RefCell`s never cross an
/// `.await`.
pub(crate) struct Actor {
    pub(crate) state: State,
    pub(crate) env: Env,
    store: Result<Store, String>,
    loaded: RefCell<Option<Loaded>>,
    /// The children this session spawned (a table of its own).
    child_store: Result<children::ChildStore, String>,
    writes: parts::Writes,
    bookkeeping: parts::Bookkeeping,
    tenant_settings: parts::TenantSettings,
    turn: parts::Turn,
    environments: parts::Environments,
    approvals: parts::Approvals,
    jobs: parts::JobState,
    deletion: parts::DeletionState,
    clients: parts::Clients,
    in_flight: parts::InFlight,
    lifecycle: parts::Lifecycle,
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
            child_store,
            writes: parts::Writes::default(),
            bookkeeping: parts::Bookkeeping::default(),
            tenant_settings: parts::TenantSettings::default(),
            turn: parts::Turn::default(),
            environments: parts::Environments::default(),
            approvals: parts::Approvals {
                approval_store,
                approval_waiters: RefCell::new(HashMap::new()),
            },
            jobs: parts::JobState {
                job_store,
                job_poll_at: Cell::new(None),
            },
            deletion: parts::DeletionState {
                deletion_store,
                deleting: Cell::new(false),
                deletion_running: Cell::new(false),
                storage_dropped: Cell::new(false),
            },
            clients: parts::Clients::default(),
            in_flight: parts::InFlight {
                tasks: tasks::Tasks::default(),
                runner_calls,
            },
            lifecycle: parts::Lifecycle::default(),
        };
        SessionActor {
            actor: Rc::new(actor),
        }
    }

    async fn fetch(&self, req: Request) -> worker::Result<Response> {
        if self.actor.lifecycle.frozen.get() {
            return Ok(faults::frozen_response());
        }
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
        if self.actor.lifecycle.frozen.get() {
            return Ok(faults::frozen_response());
        }
        let actor = self.actor.clone();
        actor.revive_sockets();
        actor.bookkeeping.alarm_armed_for.set(None);
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
            if actor.in_flight.tasks.count() == 0 {
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
            if actor
                .jobs
                .job_poll_at
                .get()
                .is_none_or(|at| at <= now().0 + 500)
            {
                actor.jobs.job_poll_at.set(None);
                actor.poll_jobs().await;
            } else {
                actor.schedule_job_poll();
            }
            // A child's lifecycle events not yet acknowledged are attempted again.
            actor.outbox_next_at_clear();
            actor.deliver_outbox().await;
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
        self.writes.committed_cursor.get()
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
            reasoning: l.meta.header.reasoning,
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
        self.clients.followers.borrow_mut().send(&event);
    }

    /// Attached environments, for the API.
    pub(crate) fn attachments(&self) -> Vec<Attachment> {
        self.environments.attachments.borrow().clone()
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
