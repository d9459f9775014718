//! `SessionActor`: one Durable Object per session.
//!
//! Each handler follows one pattern: decode → `session.handle_*` → [`Actor::pump`] (commit the
//! new entries, queue rows and checkpoint in one transaction, then perform the other effects:
//! start inference, run tools, notify followers, arm the alarm). Session meaning lives in
//! `wuhu-core`; this file only moves bytes.
//!
//! Durability: a drain whose entries are all small commits synchronously inside `pump`. A drain
//! with an entry stored out of line first writes that entry's object to R2; it and every drain
//! after it then wait in order in `pending_writes` and commit from a writer task. Nothing is
//! broadcast, started or acknowledged before its commit (`/enqueue` awaits it). A failed write
//! drops the loaded session (memory never runs ahead of storage), fails every waiting drain,
//! and arms the alarm, which reloads the session from SQLite with a visible notice.
//!
//! Internal routes (reached only through the router, which has already authenticated; identity
//! arrives in `x-wuhu-tenant` / `x-wuhu-sub`): `POST /init`, `GET /info`, `GET /transcript`,
//! `POST /enqueue`, `POST /cancel`, `POST /approval`, `POST /stop`, `POST /title`,
//! `GET /follow`, `GET /stats`. Approvals live in [`crate::approvals`].

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use serde::Deserialize;
use wasm_bindgen_futures::spawn_local;
use worker::{Date, DurableObject, Env, Request, Response, State, durable_object};
use wuhu_core::llm::{self, fake};
use wuhu_core::out_of_line;
use wuhu_core::session::{CancelError, Effect, Millis, Phase, Session};
use wuhu_core::wire::{
    CancelRequest, EnqueueRequest, EnqueueResponse, Entry, GetSessionResponse, Header, Lane,
    Message, PatchSessionRequest, QueueItemInfo, SessionInfo, Status, StopResponse, StreamEvent,
    custom_types,
};

use crate::approvals::{self, ActorApprovals, ApprovalStore};
use crate::auth::Identity;
use crate::blob_io::storage_error;
use crate::builtin_tools::ToolContext;
use crate::environment_tools::{AttachmentChange, ToolOutput};
use crate::http::{
    ApiError, ApiResult, json_response, parse_json, query, query_pairs, query_u64, read_body,
};
use crate::store::{EntryRow, RawStorage, SessionMeta, Store, Writes};
use crate::{archive_io, blob_io, follow, tenant_index};
use futures::future::LocalBoxFuture;
use std::collections::HashMap;
use wuhu_core::approvals::Outcome;
use wuhu_core::archive::HOT_TAIL_KEEP;
use wuhu_core::authority::{self, Access, Principal, SessionAction, SessionFacts, Verdict};
use wuhu_core::environments::Attachment;

mod tasks;

pub(crate) use tasks::RunnerCallScope;

/// How long a running session may go without progress before the alarm checks on it.
const WATCHDOG: Duration = Duration::from_secs(30);
/// Default system prompt.
const DEFAULT_SYSTEM_PROMPT: &str = "You are Wuhu, a helpful agent. You start without an environment; use your tools when they help.";

/// Body of the internal `POST /init`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct InitRequest {
    pub(crate) id: String,
    pub(crate) tenant: String,
    pub(crate) created_by: String,
    pub(crate) provider: Option<String>,
    pub(crate) model: Option<String>,
    pub(crate) system_prompt: Option<String>,
    pub(crate) title: Option<String>,
    /// `{path, version, content}` of the user's global context document.
    pub(crate) global_context: Option<GlobalContext>,
}

#[derive(Deserialize)]
pub(crate) struct GlobalContext {
    path: String,
    version: String,
    content: String,
}

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
    /// Inference and tool tasks running in this isolate, each with its abort handle. None
    /// after a restart.
    tasks: tasks::Tasks,
    /// `tool_call`s sent to runners and not answered yet (also in SQLite, for restarts).
    runner_calls: Rc<tasks::RunnerCalls>,
    pub(crate) flushing: Cell<bool>,
    index_dirty: Cell<bool>,
    index_sending: Cell<bool>,
    alarm_armed_for: Cell<Option<u64>>,
    /// When the running turn started in this isolate (for the turn log line).
    turn_started_at: Cell<Option<u64>>,
    /// The context window; `None` until first needed.
    tail: RefCell<Option<HotTail>>,
    /// Count and bytes of entries not archived yet; `None` when unknown.
    unarchived: Cell<Option<(u64, u64)>>,
    /// Attached environments (persisted in `meta`).
    attachments: RefCell<Vec<Attachment>>,
    /// Runner connection epoch on which each environment's snapshot was validated. Empty after a
    /// restart, so the first call after a resume validates (seed 004).
    validated: RefCell<HashMap<String, u64>>,
    /// Approvals (SQLite tables of their own).
    approval_store: Result<ApprovalStore, String>,
    /// Wakes the tool call waiting for each pending approval, by approval id. Empty after a
    /// restart until the resumed calls wait again; the stored approval is the truth.
    approval_waiters: RefCell<HashMap<String, futures::channel::oneshot::Sender<Outcome>>>,
    /// Drained batches waiting for the writer task, oldest first.
    pending_writes: RefCell<std::collections::VecDeque<Batch>>,
    /// Whether the writer task runs (then every new batch queues behind it).
    writing: Cell<bool>,
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

/// One drain of the session's effects with everything to write for it, taken at drain time so
/// that a later drain cannot leak into it.
struct Batch {
    effects: Vec<Effect>,
    writes: Writes,
    /// Objects of out-of-line entries, written before `writes`.
    blobs: Vec<out_of_line::Blob>,
    /// `(row bytes, entry bytes)` of each appended entry, in order.
    sizes: Vec<(usize, usize)>,
    /// The newest cursor the batch appends.
    writes_cursor: Option<u64>,
    deadline: Option<Millis>,
    status: Status,
    /// Told the outcome when the batch is committed or failed.
    done: Option<futures::channel::oneshot::Sender<ApiResult<()>>>,
}

/// The outcome of one [`Actor::pump`]: known at once, or when the writer task gets to it.
/// Dropping it is fine: a failure is handled (and made visible) either way.
pub(crate) struct Committed(CommittedState);

enum CommittedState {
    Done(ApiResult<()>),
    Waiting(futures::channel::oneshot::Receiver<ApiResult<()>>),
}

impl Committed {
    fn done(result: ApiResult<()>) -> Committed {
        Committed(CommittedState::Done(result))
    }

    /// Waits until the batch is committed.
    ///
    /// # Errors
    /// `storage_failed` (500) when its write failed.
    pub(crate) async fn wait(self) -> ApiResult<()> {
        match self.0 {
            CommittedState::Done(result) => result,
            CommittedState::Waiting(rx) => rx
                .await
                .unwrap_or_else(|_| Err(storage_error("the write was abandoned"))),
        }
    }
}

/// The newest entries in memory: at most [`HOT_TAIL_KEEP`] and [`TAIL_MAX_BYTES`] of JSON.
/// This is the LLM context window (decision 0001).
#[derive(Default)]
struct HotTail {
    entries: std::collections::VecDeque<(Entry, usize)>,
    bytes: usize,
}

/// Most JSON bytes of entries the context window holds.
const TAIL_MAX_BYTES: usize = 8 * 1024 * 1024;

impl HotTail {
    fn push(&mut self, entry: Entry, bytes: usize) {
        self.entries.push_back((entry, bytes));
        self.bytes += bytes;
        while self.entries.len() > HOT_TAIL_KEEP as usize
            || (self.bytes > TAIL_MAX_BYTES && self.entries.len() > 1)
        {
            if let Some((_, b)) = self.entries.pop_front() {
                self.bytes -= b;
            }
        }
    }
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
        let runner_calls = Rc::new(tasks::RunnerCalls::open(state.storage().sql()));
        let actor = Actor {
            state,
            env,
            store,
            loaded: RefCell::new(None),
            followers: RefCell::new(follow::Followers::default()),
            tasks: tasks::Tasks::default(),
            runner_calls,
            flushing: Cell::new(false),
            index_dirty: Cell::new(false),
            index_sending: Cell::new(false),
            alarm_armed_for: Cell::new(None),
            turn_started_at: Cell::new(None),
            tail: RefCell::new(None),
            unarchived: Cell::new(None),
            attachments: RefCell::new(Vec::new()),
            validated: RefCell::new(HashMap::new()),
            approval_store,
            approval_waiters: RefCell::new(HashMap::new()),
            pending_writes: RefCell::new(std::collections::VecDeque::new()),
            writing: Cell::new(false),
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
        Ok(match self.actor.clone().route(req).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        })
    }

    async fn alarm(&self) -> worker::Result<Response> {
        let actor = self.actor.clone();
        actor.alarm_armed_for.set(None);
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
        }
        Response::ok("ok")
    }
}

impl Actor {
    async fn route(self: Rc<Self>, mut req: Request) -> ApiResult<Response> {
        let path = req.path();
        let method = req.method();
        let pairs = query_pairs(&req);
        if path == "/init" {
            let body = read_body(&mut req).await?;
            let init: InitRequest = parse_json(&body)?;
            return self.init(init).await;
        }
        if !self.ensure_loaded()? {
            return Err(ApiError::not_found("session not found"));
        }
        let identity = Identity::from_headers(&req)?;
        let principal = identity.principal();
        // A session the caller may not read does not exist for them (404, also for every
        // other action), so its existence is never revealed.
        self.authorize(&principal, SessionAction::Read)?;
        let author = identity.sub.clone();
        match (method, path.as_str()) {
            (worker::Method::Get, "/info") => Ok(json_response(200, &self.info()?)),
            (worker::Method::Get, "/transcript") => {
                let since = query_u64(&pairs, "sinceCursor")?.unwrap_or(0);
                let since_time = query_u64(&pairs, "sinceTime")?;
                let limit =
                    query_u64(&pairs, "limit")?.unwrap_or(wuhu_core::archive::MAX_PAGE as u64);
                if limit == 0 || limit > wuhu_core::archive::MAX_PAGE as u64 {
                    return Err(ApiError::bad_request(format!(
                        "limit must be between 1 and {}",
                        wuhu_core::archive::MAX_PAGE
                    )));
                }
                let (entries, next_cursor) =
                    archive_io::read_page(&self, since, limit as usize).await?;
                let transcript = match since_time {
                    Some(t) => entries
                        .into_iter()
                        .filter(|e| e.created_at > t as i64)
                        .collect(),
                    None => entries,
                };
                let response = GetSessionResponse {
                    session: self.info()?,
                    transcript,
                    queue: self.queue_info(),
                    next_cursor,
                    environments: self.attachments(),
                };
                Ok(json_response(200, &response))
            }
            (worker::Method::Post, "/enqueue") => {
                self.authorize(&principal, SessionAction::Prompt)?;
                let lane_name = query(&pairs, "lane").unwrap_or_else(|| "followUp".into());
                let lane = Lane::parse_public(&lane_name).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "unknown lane {lane_name:?}: use steer or followUp"
                    ))
                })?;
                let body = read_body(&mut req).await?;
                let request: EnqueueRequest = parse_json(&body)?;
                if request.content.trim().is_empty() {
                    return Err(ApiError::bad_request("content must not be empty"));
                }
                let id = uuid::Uuid::new_v4().to_string();
                self.with_session(|s| {
                    s.handle_enqueue(now(), id.clone(), lane, author, request.content)
                })
                .ok_or_else(|| ApiError::internal("session not loaded"))?
                .map_err(|e| ApiError::new(429, "queue_full", e.to_string()))?;
                // Acknowledged only once the item's row is committed.
                self.pump().wait().await?;
                Ok(json_response(200, &EnqueueResponse { id }))
            }
            (worker::Method::Post, "/cancel") => {
                let body = read_body(&mut req).await?;
                let request: CancelRequest = parse_json(&body)?;
                let item_author = self
                    .with_loaded(|l| {
                        l.session
                            .queue()
                            .iter()
                            .find(|item| item.id == request.id)
                            .map(|item| item.author.clone())
                    })
                    .flatten();
                if let Some(item_author) = &item_author {
                    self.authorize(
                        &principal,
                        SessionAction::CancelItem {
                            author: item_author,
                        },
                    )?;
                }
                let result = self
                    .with_session(|s| s.handle_cancel(&request.id))
                    .ok_or_else(|| ApiError::internal("session not loaded"))?;
                match result {
                    Ok(()) => {
                        self.pump().wait().await?;
                        Ok(json_response(
                            200,
                            &serde_json::json!({ "id": request.id, "cancelled": true }),
                        ))
                    }
                    Err(CancelError::NotFound) => {
                        Err(ApiError::not_found("no queued item with this id"))
                    }
                    Err(CancelError::AlreadyDelivered) => Err(ApiError::new(
                        409,
                        "already_delivered",
                        "the item was already delivered",
                    )),
                }
            }
            (worker::Method::Post, "/approval") => {
                let approval_id = query(&pairs, "id").unwrap_or_default();
                let body = read_body(&mut req).await?;
                approvals::answer_route(&self, &identity, &approval_id, &body)
            }
            (worker::Method::Post, "/stop") => {
                self.authorize(&principal, SessionAction::Stop)?;
                // Waiting approvals end as withdrawn; their calls get a "stopped" result.
                approvals::withdraw_pending(&self);
                let stopped = self
                    .with_session(|s| s.handle_stop(now(), &author))
                    .unwrap_or(0);
                self.pump().wait().await?;
                let status = self.status().unwrap_or(Status::Stopped);
                Ok(json_response(
                    200,
                    &StopResponse {
                        status,
                        stopped_tool_calls: stopped,
                    },
                ))
            }
            (worker::Method::Post, "/title") => {
                let body = read_body(&mut req).await?;
                let request: PatchSessionRequest = parse_json(&body)?;
                request.validate().map_err(ApiError::bad_request)?;
                if request.title.is_some() {
                    self.authorize(&principal, SessionAction::Rename)?;
                }
                if request.access.is_some() {
                    self.authorize(&principal, SessionAction::ChangeAccess)?;
                }
                {
                    let mut loaded = self.loaded.borrow_mut();
                    if let Some(loaded) = loaded.as_mut() {
                        // Memory changes only after storage did.
                        let mut meta = loaded.meta.clone();
                        if let Some(title) = &request.title {
                            meta.title = wuhu_core::wire::normalize_title(title).ok();
                        }
                        if let Some(access) = request.access {
                            meta.access = access;
                        }
                        meta.updated_at = now().unix_seconds();
                        self.store()?.save_meta(&meta)?;
                        loaded.meta = meta;
                    }
                }
                // Visibility in the list changes with access: the index learns it before we
                // answer, so a list right after the patch is right.
                let info = self.info()?;
                tenant_index::upsert(&self.env, &info_tenant(&self), &info).await?;
                Ok(json_response(200, &info))
            }
            (worker::Method::Get, "/follow") => follow::handle(self.clone(), &req, &pairs).await,
            (worker::Method::Get, "/stats") => {
                let store = self.store()?;
                let (unarchived, _) = store.unarchived()?;
                Ok(json_response(
                    200,
                    &serde_json::json!({
                        "databaseBytes": store.database_size(),
                        "hotEntries": store.hot_count()?,
                        "followers": self.followers.borrow().len(),
                        "unarchived": unarchived,
                        "segments": store.segments()?.len(),
                    }),
                ))
            }
            _ => Err(ApiError::new(404, "not_found", "no such route")),
        }
    }

    async fn init(self: Rc<Self>, init: InitRequest) -> ApiResult<Response> {
        if self.ensure_loaded()? {
            return Err(ApiError::new(409, "conflict", "session already exists"));
        }
        let provider = init.provider.unwrap_or_else(|| fake::PROVIDER.to_string());
        let model = init
            .model
            .clone()
            .unwrap_or_else(|| llm::default_model(&provider).to_string());
        let header = Header {
            system_prompt: init
                .system_prompt
                .unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string()),
            provider,
            model,
        };
        let context = init
            .global_context
            .map(|g| Message::CustomMessage {
                custom_type: custom_types::GLOBAL_CONTEXT.into(),
                content: format!(
                    "Global context of the user (wuhu://workspace/{}, version {}):\n\n{}",
                    g.path, g.version, g.content
                ),
                details: Some(serde_json::json!({"path": format!("wuhu://workspace/{}", g.path), "version": g.version})),
            })
            .into_iter()
            .collect();
        let t = now();
        let meta = SessionMeta {
            id: init.id,
            tenant: init.tenant,
            created_by: init.created_by,
            created_at: t.unix_seconds(),
            updated_at: t.unix_seconds(),
            title: init.title,
            header: header.clone(),
            access: Access::default(),
        };
        self.store()?.save_meta(&meta)?;
        let mut session = Session::create(t, seed(), header, context);
        session.set_retry_policy(crate::inference::retry_policy(&self.env));
        *self.loaded.borrow_mut() = Some(Loaded { session, meta });
        self.pump().wait().await?;
        let info = self.info()?;
        // The index learns of the session before the caller does, so a list right after
        // creation shows it.
        tenant_index::upsert(&self.env, &info_tenant(&self), &info).await?;
        Ok(json_response(201, &info))
    }

    /// Checks `action` by `who` against the session's owner, creator and access
    /// (`wuhu_core::authority::session_allows`).
    fn authorize(&self, who: &Principal, action: SessionAction<'_>) -> ApiResult<()> {
        let verdict = self
            .with_loaded(|l| {
                let facts = SessionFacts {
                    owner: l.session.owner().unwrap_or(&l.meta.created_by),
                    created_by: &l.meta.created_by,
                    access: l.meta.access,
                };
                authority::session_allows(who, facts, action)
            })
            .unwrap_or(Verdict::Hidden);
        match verdict {
            Verdict::Allow => Ok(()),
            Verdict::Hidden => Err(ApiError::not_found("session not found")),
            Verdict::Forbidden => Err(ApiError::new(
                403,
                "forbidden",
                "only the session's owner, its creator or an admin may do this",
            )),
        }
    }

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

    /// Loads the session from SQLite if needed. Returns whether the session exists.
    /// A freshly loaded session with work in flight is resumed: this isolate has no task
    /// running for it, so the work was interrupted.
    pub(crate) fn ensure_loaded(self: &Rc<Self>) -> ApiResult<bool> {
        if self.loaded.borrow().is_some() {
            return Ok(true);
        }
        // A writer task still finishing batches of a dropped session must not race a reload.
        if self.writing.get() {
            return Err(storage_error(
                "the session is recovering from a failed write; retry shortly",
            ));
        }
        let Some(stored) = self.store()?.load()? else {
            return Ok(false);
        };
        *self.attachments.borrow_mut() = self.store()?.load_attachments()?;
        let t = now();
        let mut session = Session::restore(stored.checkpoint, stored.queue, seed());
        session.set_retry_policy(crate::inference::retry_policy(&self.env));
        if session.handle_stored_cursor(t, stored.newest_cursor) {
            worker::console_error!(
                "checkpoint was behind the stored transcript (newest cursor {}); repaired",
                stored.newest_cursor
            );
        }
        if let Some(message) = self.storage_failure.borrow_mut().take() {
            session.handle_storage_failure(t, &message);
        }
        let in_flight = session.checkpoint().phase != Phase::Idle || !session.queue().is_empty();
        if in_flight {
            session.handle_resume(t);
        }
        self.committed_cursor.set(stored.newest_cursor);
        *self.loaded.borrow_mut() = Some(Loaded {
            session,
            meta: stored.meta,
        });
        // Whatever runner calls the previous isolate's tasks left running are cancelled before
        // the resumed work starts, so a resumed step never races its predecessor's command.
        tasks::cancel_orphans(self);
        // Pumps what the restore produced (notices, resumed work). Its failure drops the
        // session again; the caller must not act on it.
        if let Committed(CommittedState::Done(Err(e))) = self.pump() {
            return Err(e);
        }
        Ok(true)
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

    /// Drains the session's effects, commits their writes (entries, queue rows, meta,
    /// checkpoint) as one transaction, then performs the rest. See the module docs for the order
    /// guarantees and what a failure does.
    pub(crate) fn pump(self: &Rc<Self>) -> Committed {
        let batch = match self.drain() {
            Ok(Some(batch)) => batch,
            Ok(None) => return Committed::done(Ok(())),
            Err(e) => return Committed::done(Err(e)),
        };
        if !self.writing.get() && batch.blobs.is_empty() {
            return Committed::done(self.commit(batch));
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        let mut batch = batch;
        batch.done = Some(tx);
        self.pending_writes.borrow_mut().push_back(batch);
        if !self.writing.replace(true) {
            spawn_local(write_pending(self.clone()));
        }
        Committed(CommittedState::Waiting(rx))
    }

    /// Takes the session's effects and everything to write for them.
    fn drain(&self) -> ApiResult<Option<Batch>> {
        let mut loaded = self.loaded.borrow_mut();
        let Some(loaded) = loaded.as_mut() else {
            return Ok(None);
        };
        let mut effects = Vec::new();
        while let Some(effect) = loaded.session.poll_effect() {
            effects.push(effect);
        }
        if effects.is_empty() {
            return Ok(None);
        }
        let mut writes = Writes::default();
        let mut blobs = Vec::new();
        let mut sizes = Vec::new();
        let (tenant, session_id) = (loaded.meta.tenant.clone(), loaded.meta.id.clone());
        for effect in &effects {
            match effect {
                Effect::AppendEntry(entry) => {
                    let stored = out_of_line::store(entry, &tenant, &session_id);
                    sizes.push((stored.row.len(), stored.entry_bytes));
                    writes.entries.push(EntryRow {
                        cursor: entry.cursor,
                        created_at: entry.created_at,
                        body: stored.row,
                    });
                    blobs.extend(stored.blob);
                }
                Effect::QueueInsert(item) => writes.queue_inserts.push(item.clone()),
                Effect::QueueDelete { id } => {
                    // An item delivered in the drain that queued it never needs a row.
                    if let Some(pos) = writes.queue_inserts.iter().position(|i| &i.id == id) {
                        writes.queue_inserts.remove(pos);
                    } else {
                        writes.queue_deletes.push(id.clone());
                    }
                }
                _ => {}
            }
        }
        let seconds = now().unix_seconds();
        if !writes.entries.is_empty() && loaded.meta.updated_at != seconds {
            loaded.meta.updated_at = seconds;
            writes.meta = Some(serde_json::to_string(&loaded.meta).map_err(|e| {
                ApiError::internal(format!("session meta serialisation failed: {e}"))
            })?);
        }
        writes.checkpoint = serde_json::to_string(loaded.session.checkpoint())
            .map_err(|e| ApiError::internal(format!("checkpoint serialisation failed: {e}")))?;
        Ok(Some(Batch {
            writes_cursor: writes.entries.last().map(|e| e.cursor),
            effects,
            writes,
            blobs,
            sizes,
            deadline: loaded.session.poll_deadline(),
            status: loaded.session.status(),
            done: None,
        }))
    }

    /// Commits one batch (its objects are already written), then performs its effects.
    fn commit(self: &Rc<Self>, mut batch: Batch) -> ApiResult<()> {
        let done = batch.done.take();
        let result = self
            .store()
            .and_then(|store| Ok(store.commit(std::mem::take(&mut batch.writes))?))
            .map_err(|e| storage_error(format!("saving the session failed: {}", e.message)));
        match &result {
            Ok(()) => {
                self.commits.set(self.commits.get() + 1);
                if let Some(newest) = batch.writes_cursor {
                    self.committed_cursor.set(newest);
                }
                self.write_failures.set(0);
                self.perform(batch);
            }
            Err(e) => self.write_failed(&e.message),
        }
        if let Some(done) = done {
            let _ = done.send(result.clone());
        }
        result
    }

    /// After a failed write: memory must not run ahead of storage, so the session is dropped
    /// (with every batch drained from it) and reloaded from SQLite by the alarm, which records
    /// the failure as a notice and resumes. Callers waiting on a batch get the error.
    fn write_failed(self: &Rc<Self>, message: &str) {
        worker::console_error!("{message}; the session is reloaded from storage");
        tasks::abandon_all(self);
        *self.loaded.borrow_mut() = None;
        *self.tail.borrow_mut() = None;
        self.unarchived.set(None);
        *self.storage_failure.borrow_mut() = Some(message.to_string());
        for batch in self.pending_writes.borrow_mut().drain(..) {
            if let Some(done) = batch.done {
                let _ = done.send(Err(storage_error(format!(
                    "an earlier write failed ({message})"
                ))));
            }
        }
        let failures = self.write_failures.get().saturating_add(1);
        self.write_failures.set(failures);
        let backoff = (1000u64 << failures.min(6)).min(60_000);
        self.alarm_armed_for.set(None);
        self.arm_alarm(Millis(now().0 + backoff));
    }

    /// Performs a committed batch's effects: hot tail and counters, followers, tasks, alarm.
    fn perform(self: &Rc<Self>, batch: Batch) {
        let Batch {
            effects,
            sizes,
            deadline,
            status,
            ..
        } = batch;
        {
            let mut tail = self.tail.borrow_mut();
            let appended = effects.iter().filter_map(|e| match e {
                Effect::AppendEntry(entry) => Some(entry),
                _ => None,
            });
            for (entry, (row_bytes, entry_bytes)) in appended.zip(sizes) {
                if let Some(tail) = tail.as_mut() {
                    tail.push(entry.clone(), entry_bytes);
                }
                if let Some((n, total)) = self.unarchived.get() {
                    self.unarchived.set(Some((n + 1, total + row_bytes as u64)));
                }
            }
        }
        let mut flush = false;
        let mut index = false;
        for effect in effects {
            match effect {
                Effect::AppendEntry(entry) => self.broadcast(StreamEvent::EntryAppended { entry }),
                Effect::StatusChanged(status) => {
                    index = true;
                    self.broadcast(StreamEvent::Status { status });
                    self.observe_turn(status);
                }
                Effect::Infer { step } => tasks::spawn_inference(self, step),
                Effect::RunTools { step, calls } => {
                    for call in calls {
                        tasks::spawn_tool(self, step, call);
                    }
                }
                Effect::CancelInference { step } => tasks::cancel_inference(self, step),
                Effect::CancelTools { step } => tasks::cancel_tools(self, step),
                // Written with the batch.
                Effect::QueueInsert(_) | Effect::QueueDelete { .. } => {}
                Effect::Idle => {
                    flush = true;
                    self.broadcast(StreamEvent::Idle);
                }
            }
        }
        if let Some(deadline) = deadline {
            self.arm_alarm(deadline);
        } else if status == Status::Running && self.alarm_armed_for.get().is_none() {
            self.arm_alarm(Millis(now().0 + WATCHDOG.as_millis() as u64));
        }
        if index {
            self.schedule_index_update();
        }
        if flush || self.unarchived_over_threshold() {
            spawn_local(archive_io::flush(self.clone()));
        }
    }

    /// Notes when a turn starts and logs one line when it ends (`observe::TurnLine`).
    fn observe_turn(&self, status: Status) {
        if status == Status::Running {
            self.turn_started_at.set(Some(now().0));
            return;
        }
        let started = self.turn_started_at.take();
        let Some((session, tenant, step, last_cursor)) = self.with_loaded(|l| {
            (
                l.meta.id.clone(),
                l.meta.tenant.clone(),
                l.session.checkpoint().step,
                l.session.last_cursor(),
            )
        }) else {
            return;
        };
        crate::observe::TurnLine {
            tenant: &tenant,
            session: &session,
            status: status.as_str(),
            step,
            last_cursor,
            duration_ms: started.map(|t| now().0.saturating_sub(t)),
        }
        .emit();
    }

    fn unarchived_over_threshold(&self) -> bool {
        let counts = match self.unarchived.get() {
            Some(counts) => counts,
            None => {
                let Ok(counts) = self.store().and_then(|s| Ok(s.unarchived()?)) else {
                    return false;
                };
                self.unarchived.set(Some(counts));
                counts
            }
        };
        wuhu_core::archive::should_flush(counts.0, counts.1, false)
    }

    /// Forgets the unarchived counters (after a flush changed them).
    pub(crate) fn invalidate_unarchived(&self) {
        self.unarchived.set(None);
    }

    pub(crate) fn broadcast(&self, event: StreamEvent) {
        self.followers.borrow_mut().send(&event);
    }

    fn arm_alarm(self: &Rc<Self>, at: Millis) {
        // One alarm serves the loop and approval expiry: never later than the next expiry.
        let at = match self.approval_store().map(|s| s.next_expiry()) {
            Ok(Ok(Some(expiry))) if expiry < at => expiry,
            _ => at,
        };
        if self.alarm_armed_for.get() == Some(at.0) {
            return;
        }
        self.alarm_armed_for.set(Some(at.0));
        let storage = self.state.storage();
        spawn_local(async move {
            // An offset from now: the alarm API takes either an offset or a chrono date.
            let offset_ms = at.0.saturating_sub(now().0).max(1) as i64;
            if let Err(e) = storage.set_alarm(offset_ms).await {
                worker::console_error!("setting the alarm failed: {e}");
            }
        });
    }

    /// Arms the alarm for `at` unless it is armed for earlier already.
    pub(crate) fn arm_alarm_by(self: &Rc<Self>, at: Millis) {
        if self.alarm_armed_for.get().is_none_or(|armed| armed > at.0) {
            self.arm_alarm(at);
        }
    }

    pub(crate) fn approval_store(&self) -> ApiResult<&ApprovalStore> {
        self.approval_store
            .as_ref()
            .map_err(|e| ApiError::internal(format!("approval storage unavailable: {e}")))
    }

    /// A future that ends when approval `id` ends (see [`Actor::wake_approval`]). A dropped
    /// waiter (the actor went away) counts as withdrawn: the call is rerun after a restart.
    pub(crate) fn wait_for_approval(&self, id: &str) -> LocalBoxFuture<'static, Outcome> {
        let (wake, ended) = futures::channel::oneshot::channel();
        self.approval_waiters
            .borrow_mut()
            .insert(id.to_string(), wake);
        Box::pin(async move { ended.await.unwrap_or(Outcome::Withdrawn) })
    }

    /// Wakes the call waiting for approval `id`, if any.
    pub(crate) fn wake_approval(&self, id: &str, outcome: Outcome) {
        if let Some(wake) = self.approval_waiters.borrow_mut().remove(id) {
            let _ = wake.send(outcome);
        }
    }

    /// Sends the latest session info to the tenant index; one send at a time, coalesced.
    pub(crate) fn schedule_index_update(self: &Rc<Self>) {
        self.index_dirty.set(true);
        if self.index_sending.get() {
            return;
        }
        self.index_sending.set(true);
        let actor = self.clone();
        spawn_local(async move {
            while actor.index_dirty.replace(false) {
                let Ok(info) = actor.info() else { break };
                if let Err(e) = tenant_index::upsert(&actor.env, &info_tenant(&actor), &info).await
                {
                    worker::console_error!("updating the session index failed: {}", e.message);
                }
            }
            actor.index_sending.set(false);
        });
    }

    /// Context entries for the LLM: the hot tail, from memory (read from SQLite once, with
    /// out-of-line entries put back).
    pub(crate) async fn context_inputs(&self) -> Option<(Header, Vec<Entry>)> {
        let header = self.with_loaded(|l| l.meta.header.clone())?;
        while self.tail.borrow().is_none() {
            let commits = self.commits.get();
            let rows = self
                .store()
                .ok()?
                .newest_entries(HOT_TAIL_KEEP as usize)
                .ok()?;
            let entries = rows.into_iter().map(|(entry, _)| entry).collect();
            let entries = blob_io::resolve(&self.env, &self.tenant(), &self.session_id(), entries)
                .await
                .ok()?;
            // A commit during the reads pushed nothing (no tail yet): read again.
            if self.commits.get() != commits {
                continue;
            }
            let mut loaded = HotTail::default();
            for entry in entries {
                let bytes = serde_json::to_string(&entry).map_or(0, |j| j.len());
                loaded.push(entry, bytes);
            }
            *self.tail.borrow_mut() = Some(loaded);
        }
        let tail = self.tail.borrow();
        let entries = tail
            .as_ref()?
            .entries
            .iter()
            .map(|(e, _)| e.clone())
            .collect();
        Some((header, entries))
    }

    /// The complete context a tool call gets.
    pub(crate) fn tool_context(self: &Rc<Self>, step: u64) -> ToolContext {
        ToolContext {
            env: self.env.clone(),
            tenant: self.tenant(),
            session_id: self.session_id(),
            owner: self.owner(),
            turn_authors: self
                .with_loaded(|l| l.session.turn_authors().to_vec())
                .unwrap_or_default(),
            attachments: self.attachments.borrow().clone(),
            validated: self.validated.borrow().clone(),
            approvals: Rc::new(ActorApprovals {
                actor: self.clone(),
                step,
            }),
            runner_calls: RunnerCallScope {
                calls: self.runner_calls.clone(),
                step,
            },
        }
    }

    /// Applies a finished tool's output: attachment changes, entries before the result, the
    /// result. All synchronous, so it commits as one write. A call that no longer runs (stopped,
    /// or from before a restart) changes nothing.
    pub(crate) fn finish_tool(self: &Rc<Self>, step: u64, call_id: &str, output: ToolOutput) {
        let running = self
            .with_loaded(|l| l.session.is_tool_running(step, call_id))
            .unwrap_or(false);
        if !running {
            return;
        }
        self.validated.borrow_mut().extend(output.validated);
        if let Some(change) = output.change {
            let mut attachments = self.attachments.borrow_mut();
            match change {
                AttachmentChange::Attach(attachment) => attachments.push(attachment),
                AttachmentChange::Detach(name) => {
                    attachments.retain(|a| a.name() != name);
                    self.validated.borrow_mut().remove(&name);
                }
            }
            if let Ok(store) = self.store()
                && let Err(e) = store.save_attachments(&attachments)
            {
                worker::console_error!("saving attachments failed: {e}");
            }
        }
        self.with_session(|s| {
            s.handle_tool_progress(now(), step, call_id, output.entries);
            s.handle_tool_done(now(), step, call_id, output.content, output.is_error);
        });
        self.pump();
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

/// The writer task: writes each waiting batch's objects, then commits it, in order. Runs while
/// batches wait; a failure fails every batch behind it (see [`Actor::write_failed`]).
async fn write_pending(actor: Rc<Actor>) {
    loop {
        let Some(batch) = actor.pending_writes.borrow_mut().pop_front() else {
            break;
        };
        let mut uploaded = Ok(());
        for blob in &batch.blobs {
            uploaded = blob_io::write(&actor.env, blob).await;
            if uploaded.is_err() {
                break;
            }
        }
        match uploaded {
            Ok(()) => {
                let _ = actor.commit(batch);
            }
            Err(e) => {
                actor.write_failed(&e.message);
                if let Some(done) = batch.done {
                    let _ = done.send(Err(e));
                }
            }
        }
    }
    actor.writing.set(false);
}
