//! The actor's internal routes: decode a request, check who may act, call
//! `Session::handle_*`, pump, and answer once the change is committed.

use std::rc::Rc;

use worker::{Request, Response};
use wuhu_core::authority::{self, Principal, SessionAction, SessionFacts, Verdict};
use wuhu_core::calls::Empty;
use wuhu_core::calls::session::{
    Accepted, ChildAdmission, ChildCreated, ChildInit, ChildInput, ForkInit, Needs, PrefixPage,
    PrefixRequest, SessionCall, SessionInit, Transcript,
};
use wuhu_core::session::{CancelError, EnqueueError, ForkPrefix, Session};
use wuhu_core::wire::{
    CancelRequest, CancelResponse, CompactResponse, CompactionReason, EnqueueRequest,
    EnqueueResponse, EntryPayload, GetSessionResponse, Header, Lane, Message, PatchSessionRequest,
    SessionInfo, SessionStats, Status, StopResponse, UsageResponse, custom_types,
};

use super::store::SessionMeta;
use super::{Actor, Loaded, approvals, archive, choice, follow, inference, info_tenant, now, seed};
use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};
use crate::internal::{self, reply};
use crate::tenant_index;
use wuhu_core::tenant_config::TenantConfig;

/// Default system prompt.
const DEFAULT_SYSTEM_PROMPT: &str = "You are Wuhu, a helpful agent. You start without an environment; use your tools when they help.";

impl Actor {
    /// Decodes the call `req` carries, checks what it needs of its caller
    /// (`SessionCall::needs`), and answers it.
    pub(super) async fn route(self: Rc<Self>, mut req: Request) -> ApiResult<Response> {
        let (name, body) = internal::call_parts(&mut req).await?;
        let call = SessionCall::decode(&name, &body).map_err(internal::call_error)?;
        let identity = match call.needs() {
            Needs::Internal => None,
            Needs::Person(actions) => {
                let identity = Identity::from_headers(&req)?;
                // A deletion answers for a marked session too (it checks the mark itself).
                if !matches!(call, SessionCall::Delete(_)) {
                    if !self.ensure_loaded()? {
                        return Err(ApiError::not_found("session not found"));
                    }
                    // Reading comes first: a session the caller may not read does not exist
                    // for them (404, also for every other action), so its existence is never
                    // revealed.
                    let principal = identity.principal();
                    for action in actions {
                        self.authorize(&principal, action)?;
                    }
                }
                Some(identity)
            }
        };
        let person = || {
            identity
                .clone()
                .ok_or_else(|| ApiError::internal("a person's call without a person"))
        };
        match call {
            // From the tenant's index, before anything is loaded: a deleted or evicted actor
            // answers too (it keeps nothing).
            SessionCall::ForgetSettings(c) => {
                self.tenant_settings.settings.borrow_mut().forget();
                Ok(reply(&c, &Empty))
            }
            SessionCall::Create(c) => {
                let (info, _) = self.clone().init(c.0.clone(), None).await?;
                Ok(reply(&c, &info))
            }
            SessionCall::CreateChild(c) => {
                let (session, admission) = self
                    .clone()
                    .init(c.init.clone(), Some(c.child.clone()))
                    .await?;
                let admission =
                    admission.ok_or_else(|| ApiError::internal("a child without an admission"))?;
                Ok(reply(&c, &ChildCreated { session, admission }))
            }
            SessionCall::CreateFork(c) => {
                let info = self.clone().fork_init(c.0.clone()).await?;
                Ok(reply(&c, &info))
            }
            // Deletion answers for a marked session too (the steps go on).
            SessionCall::Delete(c) => Ok(reply(&c, &self.delete_route(identity.as_ref()).await?)),
            SessionCall::Dispose(c) => Ok(reply(&c, &self.delete_route(None).await?)),
            // Calls between a parent's and a child's actors, a fork's, the hub's. The router
            // never decodes them from a client's request, so only actors of this tenant send
            // them.
            SessionCall::ChildEvent(c) => {
                self.loaded_or_404()?;
                let accepted = self.child_event(c.0.clone()).await?;
                Ok(reply(&c, &Accepted { accepted }))
            }
            SessionCall::GiveChildInput(c) => {
                self.loaded_or_404()?;
                if c.0.content.trim().is_empty() {
                    return Err(ApiError::bad_request("content must not be empty"));
                }
                let admission = self.submit_input(c.0.clone(), false).await?;
                Ok(reply(&c, &admission))
            }
            SessionCall::Prefix(c) => {
                self.loaded_or_404()?;
                Ok(reply(&c, &self.prefix(&c.0).await?))
            }
            SessionCall::JobEnded(c) => {
                self.loaded_or_404()?;
                let accepted = self.job_event(c.0.clone()).await?;
                Ok(reply(&c, &Accepted { accepted }))
            }
            // A running call's output, relayed by the runner hub: shown to followers, never
            // stored (`wuhu_core::tool_output`).
            SessionCall::ToolOutput(c) => {
                let event = self.in_flight.runner_calls.output(&c.0);
                let accepted = event.is_some();
                if let Some(event) = event {
                    self.broadcast(event);
                }
                Ok(reply(&c, &Accepted { accepted }))
            }
            SessionCall::Start(c) => {
                self.loaded_or_404()?;
                self.start_pending().await?;
                Ok(reply(&c, &Empty))
            }
            SessionCall::SlotHeld(c) => {
                self.loaded_or_404()?;
                Ok(reply(&c, &self.slot_held()))
            }
            SessionCall::Info(c) => Ok(reply(&c, &self.info()?)),
            // A session's tools read this one for the people their turn acts for: what every
            // one of them may read, or (a turn for nobody) only their own children.
            SessionCall::ReadFor(c) => {
                self.loaded_or_404()?;
                let readable = self
                    .with_loaded(|l| {
                        let facts = SessionFacts {
                            owner: l.session.owner().unwrap_or(&l.meta.created_by),
                            created_by: &l.meta.created_by,
                            access: l.meta.access,
                        };
                        c.readers.may_read(
                            &l.meta.tenant,
                            facts,
                            l.meta.lineage.parent_id.as_deref(),
                        )
                    })
                    .unwrap_or(false);
                if !readable {
                    return Err(ApiError::not_found("session not found"));
                }
                Ok(reply(&c, &self.transcript(&c.page).await?))
            }
            SessionCall::Transcript(c) => Ok(reply(&c, &self.transcript(&c).await?)),
            SessionCall::Enqueue(c) => {
                let response = self
                    .enqueue(&person()?, c.lane, c.request.clone(), c.item_key.clone())
                    .await?;
                Ok(reply(&c, &response))
            }
            SessionCall::Cancel(c) => Ok(reply(&c, &self.cancel(&person()?, c.0.clone()).await?)),
            // A chat channel's outbox gave up a message of this session: a notice in the
            // transcript.
            SessionCall::Notice(c) => {
                let bounded = |text: &str| -> String { text.chars().take(500).collect() };
                self.with_session(|s| {
                    s.handle_channel_undelivered(
                        now(),
                        &bounded(&c.channel),
                        &bounded(&c.key),
                        &bounded(&c.reason),
                    )
                });
                self.pump().wait().await?;
                Ok(reply(&c, &Empty))
            }
            SessionCall::AnswerApproval(c) => {
                let answered =
                    approvals::answer_route(&self, &person()?, &c.approval_id, &c.answer).await?;
                Ok(reply(&c, &answered))
            }
            SessionCall::Stop(c) => Ok(reply(&c, &self.stop(&person()?).await?)),
            SessionCall::Patch(c) => Ok(reply(&c, &self.patch(&person()?, &c.0).await?)),
            SessionCall::Follow(c) => follow::handle(self.clone(), &c, &person()?).await,
            SessionCall::Socket(c) => self.accept_socket(&req, &c, &person()?).await,
            SessionCall::Compact(c) => {
                let compacted = self.clone().compact(c.0.instructions.clone()).await?;
                Ok(reply(&c, &compacted))
            }
            SessionCall::Usage(c) => Ok(reply(&c, &self.usage().await?)),
            SessionCall::Jobs(c) => Ok(reply(&c, &self.jobs_listed()?)),
            SessionCall::Stats(c) => Ok(reply(&c, &self.stats()?)),
        }
    }

    /// `404` unless the session exists (and is not being deleted).
    fn loaded_or_404(self: &Rc<Self>) -> ApiResult<()> {
        if self.ensure_loaded()? {
            Ok(())
        } else {
            Err(ApiError::not_found("session not found"))
        }
    }

    /// A transcript page with the session, its queue, environments and children.
    async fn transcript(self: &Rc<Self>, page: &Transcript) -> ApiResult<GetSessionResponse> {
        let (entries, next_cursor) =
            archive::read_page(self, page.since_cursor, page.limit as usize).await?;
        let transcript = match page.since_time {
            Some(t) => entries
                .into_iter()
                .filter(|e| e.created_at > t as i64)
                .collect(),
            None => entries,
        };
        Ok(GetSessionResponse {
            session: self.info()?,
            transcript,
            queue: self.queue_info(),
            next_cursor,
            environments: self.attachments(),
            children: self.children_list(),
        })
    }

    /// `PATCH`: title, access, budget, provider and model (the caller was authorised for the
    /// fields it changes, `SessionCall::needs`). Memory changes only after storage did.
    async fn patch(
        self: &Rc<Self>,
        identity: &Identity,
        request: &PatchSessionRequest,
    ) -> ApiResult<SessionInfo> {
        let author = identity.sub.clone();
        // A switch follows the rule a creation does (`wuhu_core::llm::choice`), with the budget
        // as this patch leaves it; checked before anything is stored.
        if let Some((to, own_usd, ancestor_usd)) = self
            .with_loaded(|l| {
                request.switched(&l.meta.header).map(|to| {
                    (
                        to,
                        l.session.budget().is_some_and(|b| b.max_usd.is_some()),
                        l.meta.lineage.usd_budget_above,
                    )
                })
            })
            .flatten()
        {
            let own_usd = request.budget.map_or(own_usd, |b| b.max_usd.is_some());
            choice::check_model(
                &self.env,
                &self.tenant(),
                &to.provider,
                &to.model,
                own_usd,
                ancestor_usd,
            )
            .await?;
            // The reasoning setting as the patch leaves it must suit the model it leaves.
            if let Some(reasoning) = &to.reasoning {
                let settings = super::inference::settings(self)
                    .await
                    .map_err(choice::settings_error)?;
                choice::check_reasoning(&settings.models, &to.provider, &to.model, reasoning)?;
            }
        }
        let mut switched = None;
        {
            let mut loaded = self.loaded.borrow_mut();
            if let Some(loaded) = loaded.as_mut() {
                let mut meta = loaded.meta.clone();
                if let Some(header) = request.switched(&meta.header) {
                    switched = Some((meta.header.clone(), header.clone()));
                    meta.header = header;
                }
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
        if let Some((from, to)) = switched {
            self.with_session(|s| {
                if from.provider != to.provider || from.model != to.model {
                    s.handle_model_changed(now(), &from, &to, &author);
                }
                if from.reasoning != to.reasoning {
                    s.handle_reasoning_changed(now(), from.reasoning, to.reasoning, &author, None);
                }
            });
            self.pump().wait().await?;
        }
        if let Some(budget) = request.budget {
            self.with_session(|s| s.handle_budget(now(), budget, &author));
            self.pump().wait().await?;
        }
        // Visibility in the list changes with access: the index learns it before we answer,
        // so a list right after the patch is right.
        let info = self.info()?;
        tenant_index::upsert(&self.env, &info_tenant(self), &info).await?;
        Ok(info)
    }

    /// `GET /jobs`: the jobs this session keeps, newest first.
    fn jobs_listed(self: &Rc<Self>) -> ApiResult<wuhu_core::wire::JobsResponse> {
        let mut jobs = match &self.jobs.job_store {
            Ok(store) => store.list(),
            Err(e) => return Err(ApiError::internal(format!("the jobs table: {e}"))),
        };
        jobs.sort_by_key(|j| std::cmp::Reverse(j.started_at_ms));
        Ok(wuhu_core::wire::JobsResponse { jobs })
    }

    /// `GET /usage`: every page, archived ones included (O(transcript), like reading it
    /// whole). A fork counts what it spent itself, not its history.
    async fn usage(self: &Rc<Self>) -> ApiResult<UsageResponse> {
        let mut usage = wuhu_core::llm::models::SessionUsage::default();
        let mut since = self
            .with_loaded(|l| l.meta.forked_from.as_ref().map(|f| f.cursor))
            .flatten()
            .unwrap_or(0);
        loop {
            let (entries, next_cursor) =
                archive::read_page(self, since, wuhu_core::archive::MAX_PAGE).await?;
            usage.add_entries(&entries);
            match next_cursor {
                Some(next) if next > since => since = next,
                _ => break,
            }
        }
        let (spent, budget) = self
            .with_loaded(|l| (l.session.spent(), l.session.budget()))
            .ok_or_else(|| ApiError::internal("session not loaded"))?;
        Ok(UsageResponse {
            usage,
            spent,
            budget,
        })
    }

    /// `GET /stats`: the actor's storage.
    fn stats(&self) -> ApiResult<SessionStats> {
        let store = self.store()?;
        let (unarchived, _) = store.unarchived()?;
        Ok(SessionStats {
            database_bytes: store.database_size() as u64,
            hot_entries: store.hot_count()?,
            followers: self.clients.followers.borrow().len() as u64,
            unarchived,
            segments: store.segments()?.len() as u64,
        })
    }

    /// `POST /enqueue` and a socket's `enqueue` frame: who may prompt, the lane, the content,
    /// the tenant's budget; answered once the item's row is committed. The caller has checked
    /// that `identity` may read the session. `internal_key` names a chat binding's message; a
    /// client names its own with the body's `key`. A message named by a key its author sent
    /// before (still queued, or among the last delivered) is answered as the first was and
    /// queued once.
    pub(super) async fn enqueue(
        self: &Rc<Self>,
        identity: &Identity,
        lane: Lane,
        mut request: EnqueueRequest,
        internal_key: Option<String>,
    ) -> ApiResult<EnqueueResponse> {
        self.authorize(&identity.principal(), SessionAction::Prompt)?;
        crate::rate_limit::check(
            &self.env,
            wuhu_core::rate_limits::RateAction::Enqueue,
            &identity.tenant,
            &identity.sub,
        )
        .await?;
        let client_key = request.key.take();
        if let Some(key) = &client_key {
            wuhu_core::session::check_item_key(key).map_err(ApiError::bad_request)?;
        }
        let key = internal_key.or(client_key);
        let author = identity.sub.clone();
        if request.content.trim().is_empty() {
            return Err(ApiError::bad_request("content must not be empty"));
        }
        // A pasted credential is masked before it is queued: the transcript, the provider and
        // every follower see the placeholder (docs/security.md, "Secrets").
        let settings = super::inference::settings(self).await;
        // A reasoning setting for the turn must suit the session's model: refused before
        // anything is queued.
        if let Some(reasoning) = &request.reasoning {
            let settings = settings
                .as_ref()
                .map_err(|e| choice::settings_error(e.clone()))?;
            let (provider, model) = self
                .with_loaded(|l| (l.meta.header.provider.clone(), l.meta.header.model.clone()))
                .ok_or_else(|| ApiError::internal("session not loaded"))?;
            choice::check_reasoning(&settings.models, &provider, &model, reasoning)?;
        }
        let masker = match &settings {
            Ok(settings) => settings.masker(&self.env, &self.tenant()),
            Err(_) => self.masker(),
        };
        if let std::borrow::Cow::Owned(masked) = masker.mask(&request.content) {
            request.content = masked;
        }
        // Once a step found the tenant's budget spent, input is refused until it is
        // raised (asked again each time).
        if self.bookkeeping.tenant_budget_spent.get() {
            match tenant_index::budget(&self.env, &self.tenant()).await {
                Ok(state) if state.exceeded().is_some() => {
                    return Err(ApiError::new(
                        402,
                        "budget_exceeded",
                        "the tenant's budget is spent: an admin can raise it",
                    ));
                }
                Ok(_) => self.bookkeeping.tenant_budget_spent.set(false),
                Err(e) => {
                    worker::console_error!("asking the tenant's budget failed: {}", e.message)
                }
            }
        }
        let keyed = key.map(|key| wuhu_core::session::keyed_item_id(&author, &key));
        let id = keyed
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let reasoning = request.reasoning;
        let queued = self
            .with_session(|s| {
                s.handle_enqueue_with_reasoning(
                    now(),
                    id.clone(),
                    lane,
                    author,
                    request.content,
                    reasoning,
                    keyed.is_some(),
                )
            })
            .ok_or_else(|| ApiError::internal("session not loaded"))?
            .map_err(|e| match e {
                EnqueueError::BudgetExceeded { .. } => {
                    ApiError::new(402, "budget_exceeded", e.to_string())
                }
                _ => ApiError::new(429, "queue_full", e.to_string()),
            })?;
        // Acknowledged only once the item's row is committed: this one's, or (sent again) the
        // first one's, which may still wait behind an object write.
        if queued {
            self.pump().wait().await?;
        } else {
            self.settled().await?;
        }
        Ok(EnqueueResponse { id })
    }

    /// `POST /cancel` and a socket's `cancel` frame (the caller has checked that `identity` may
    /// read the session).
    pub(super) async fn cancel(
        self: &Rc<Self>,
        identity: &Identity,
        request: CancelRequest,
    ) -> ApiResult<CancelResponse> {
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
                &identity.principal(),
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
                Ok(CancelResponse {
                    id: request.id,
                    cancelled: true,
                })
            }
            Err(CancelError::NotFound) => Err(ApiError::not_found("no queued item with this id")),
            Err(CancelError::AlreadyDelivered) => Err(ApiError::new(
                409,
                "already_delivered",
                "the item was already delivered",
            )),
        }
    }

    /// `POST /stop` and a socket's `stop` frame (the caller has checked that `identity` may
    /// read the session).
    pub(super) async fn stop(self: &Rc<Self>, identity: &Identity) -> ApiResult<StopResponse> {
        self.authorize(&identity.principal(), SessionAction::Stop)?;
        // Waiting approvals end as withdrawn; their calls get a "stopped" result.
        approvals::withdraw_pending(self);
        // Input a child keeps for a slot is dropped: stopped means stopped.
        self.take_pending()?;
        let stopped = self
            .with_session(|s| s.handle_stop(now(), &identity.sub))
            .unwrap_or(0);
        self.pump().wait().await?;
        // Running children stop with it, unless spawned detached.
        self.cascade_stop().await;
        // So do its background jobs (each ends `killed`, with its message).
        self.kill_jobs().await;
        let status = self.status().unwrap_or(Status::Stopped);
        Ok(StopResponse {
            status,
            stopped_tool_calls: stopped,
        })
    }

    /// A manual compaction: the summary request, then the `compaction` entry. It may run
    /// while a turn runs (the summary covers only entries before the kept ones); of two at
    /// once, the second is refused (409).
    async fn compact(self: Rc<Self>, instructions: Option<String>) -> ApiResult<CompactResponse> {
        let header = inference::context_window(&self)
            .await
            .ok_or_else(|| ApiError::internal("could not read the transcript"))?;
        let settings = inference::settings(&self)
            .await
            .map_err(|failure| ApiError::new(409, "invalid_tenant_config", failure.message))?;
        // A summary is a request like a step's: under a USD limit its model needs a price.
        let tenant_usd = match self.bookkeeping.known_budget.get() {
            Some(known) => known.state.usd_limited(),
            None => tenant_index::budget(&self.env, &self.tenant())
                .await?
                .usd_limited(),
        };
        self.check_step_priced(&settings.models, tenant_usd)
            .map_err(crate::model_choice::unpriced)?;
        let group_chat_since = self.with_loaded(|l| l.session.group_chat_since()).flatten();
        let job = {
            let tail = self.turn.tail.borrow();
            let window = tail
                .as_ref()
                .ok_or_else(|| ApiError::internal("could not read the transcript"))?;
            wuhu_core::compaction::plan_compaction(
                &header,
                &settings.models,
                window,
                group_chat_since,
                &wuhu_core::tools::catalogue(),
                CompactionReason::Manual,
                instructions,
            )
        }
        .map_err(|e| ApiError::new(409, "nothing_to_compact", e.to_string()))?;
        match inference::compact(
            &self,
            inference::Purpose::Summary(None),
            &header,
            &settings,
            job,
        )
        .await
        {
            Ok(Some((cursor, compaction))) => Ok(CompactResponse { cursor, compaction }),
            Ok(None) => Err(ApiError::new(
                409,
                "conflict",
                "the compaction was abandoned",
            )),
            Err(failure)
                if failure
                    .message
                    .contains("does not move the context forward") =>
            {
                Err(ApiError::new(409, "conflict", failure.message))
            }
            Err(failure) => Err(ApiError::new(502, "llm_error", failure.message)),
        }
    }

    /// Creates the session (a child with `child`). A child's task goes through the
    /// concurrency gate before this answers.
    pub(super) async fn init(
        self: Rc<Self>,
        init: SessionInit,
        child: Option<ChildInit>,
    ) -> ApiResult<(SessionInfo, Option<ChildAdmission>)> {
        if self.ensure_loaded()? {
            return Err(ApiError::new(409, "conflict", "session already exists"));
        }
        if self.deletion_mark()?.is_some() {
            return Err(ApiError::new(
                409,
                "conflict",
                "the session is being deleted",
            ));
        }
        // The provider and model (`wuhu_core::llm::choice`): the one named, else the tenant's
        // default (read only then), else `fake` where the server allows it; then a price while
        // a USD limit applies. Checked before anything is stored.
        // The tenant's settings are read when the tenant's default provider or its model table
        // (for a reasoning setting) is needed.
        let settings = match (&init.provider, &init.reasoning) {
            (Some(_), None) => None,
            _ => Some(
                inference::settings_of(&self.env, &init.tenant)
                    .await
                    .map_err(choice::settings_error)?,
            ),
        };
        let tenant_config = match (&init.provider, &settings) {
            (None, Some(settings)) => settings.tenant.clone(),
            _ => TenantConfig::default(),
        };
        let (provider, model) = wuhu_core::llm::choice::choose(
            init.provider.as_deref(),
            init.model.as_deref(),
            &tenant_config,
            crate::model_choice::fake_enabled(&self.env),
        )
        .map_err(crate::model_choice::provider_refused)?;
        choice::check_model(
            &self.env,
            &init.tenant,
            &provider,
            &model,
            init.budget.is_some_and(|b| b.max_usd.is_some()),
            child.as_ref().is_some_and(|c| c.lineage.usd_budget_above),
        )
        .await?;
        if let (Some(reasoning), Some(settings)) = (&init.reasoning, &settings) {
            choice::check_reasoning(&settings.models, &provider, &model, reasoning)?;
        }
        // A session deleted in this isolate is created again (an id derived from a chat thread).
        self.recreate_tables()?;
        self.deletion.deleting.set(false);
        let header = Header {
            system_prompt: init
                .system_prompt
                .unwrap_or_else(|| DEFAULT_SYSTEM_PROMPT.to_string()),
            provider,
            model,
            reasoning: init.reasoning,
        };
        let context: Vec<EntryPayload> = init
            .global_context
            .map(|g| Message::CustomMessage {
                custom_type: custom_types::GLOBAL_CONTEXT.into(),
                content: format!(
                    "Global context of the user (wuhu://workspace/{}, version {}):\n\n{}",
                    g.path, g.version, g.content
                ),
                details: Some(serde_json::json!({"path": format!("wuhu://workspace/{}", g.path), "version": g.version})),
            })
            .map(|message| EntryPayload::Message { message })
            .into_iter()
            .chain(child.iter().flat_map(|c| c.entries.iter().cloned()))
            .collect();
        let t = now();
        let meta = SessionMeta {
            id: init.id,
            tenant: init.tenant,
            created_by: init.created_by,
            created_at: t.unix_seconds(),
            updated_at: t.unix_seconds(),
            // Every way in (the API, spawn, a chat thread) cleaned it already; kept here too so
            // that no title is stored that another person's list would show differently.
            title: init
                .title
                .and_then(|t| wuhu_core::text::bounded_title(&t, wuhu_core::wire::MAX_TITLE_CHARS)),
            header: header.clone(),
            access: child.as_ref().map(|c| c.access).unwrap_or_default(),
            lineage: child
                .as_ref()
                .map(|c| c.lineage.clone())
                .unwrap_or_default(),
            pending: Vec::new(),
            construct: child.as_ref().and_then(|c| c.construct.clone()),
            made: None,
            worktree_end: None,
            forked_from: None,
            channel: init.channel,
        };
        self.store()?.save_meta(&meta)?;
        if let Some(child) = &child
            && !child.attachments.is_empty()
        {
            self.store()?.save_attachments(&child.attachments)?;
            *self.environments.attachments.borrow_mut() = child.attachments.clone();
        }
        let mut session = Session::create_with_entries(t, seed(), header, context);
        session.set_retry_policy(inference::retry_policy(&self.env));
        if let Some(budget) = init.budget {
            session.handle_budget(t, budget, &meta.created_by);
        }
        *self.loaded.borrow_mut() = Some(Loaded { session, meta });
        self.pump().wait().await?;
        let info = self.info()?;
        // The index learns of the session before the caller does, so a list right after
        // creation shows it.
        tenant_index::create(&self.env, &info_tenant(&self), &info).await?;
        let Some(child) = child else {
            return Ok((info, None));
        };
        // A child's task goes through the concurrency gate.
        let admission = self
            .submit_input(
                ChildInput {
                    content: child.task,
                    lane: Lane::FollowUp,
                    author: info.created_by.clone(),
                    acting_for: child.acting_for,
                },
                true,
            )
            .await?;
        Ok((self.info()?, Some(admission)))
    }

    /// A fork: reads its history from the session forked, page by page, to derive its state
    /// (`Session::fork`); nothing of the history is copied.
    pub(super) async fn fork_init(self: Rc<Self>, init: ForkInit) -> ApiResult<SessionInfo> {
        if self.ensure_loaded()? {
            return Err(ApiError::new(409, "conflict", "session already exists"));
        }
        if self.deletion_mark()?.is_some() {
            return Err(ApiError::new(
                409,
                "conflict",
                "the session is being deleted",
            ));
        }
        // A session deleted in this isolate is created again (an id derived from a chat thread).
        self.recreate_tables()?;
        self.deletion.deleting.set(false);
        let mut prefix = ForkPrefix::default();
        while prefix.last_cursor() < init.from.cursor {
            let page = crate::session_client::prefix(
                &self.env,
                &init.tenant,
                &init.from.session_id,
                prefix.last_cursor(),
                wuhu_core::archive::MAX_PAGE as u64,
                init.from.cursor,
            )
            .await?;
            if page.entries.is_empty() {
                return Err(ApiError::internal(format!(
                    "the history of the fork ended at cursor {} of {}",
                    prefix.last_cursor(),
                    init.from.cursor
                )));
            }
            for entry in &page.entries {
                if entry.cursor != prefix.last_cursor() + 1 {
                    return Err(ApiError::internal(format!(
                        "the history of the fork skips from cursor {} to {}",
                        prefix.last_cursor(),
                        entry.cursor
                    )));
                }
                prefix.observe(entry);
            }
        }
        let header = prefix
            .header()
            .cloned()
            .ok_or_else(|| ApiError::internal("the history of the fork has no header"))?;
        let t = now();
        let meta = SessionMeta {
            id: init.id,
            tenant: init.tenant,
            created_by: init.created_by.clone(),
            created_at: t.unix_seconds(),
            updated_at: t.unix_seconds(),
            title: init
                .title
                .and_then(|t| wuhu_core::text::bounded_title(&t, wuhu_core::wire::MAX_TITLE_CHARS)),
            header,
            access: Default::default(),
            lineage: Default::default(),
            pending: Vec::new(),
            construct: None,
            made: None,
            worktree_end: None,
            forked_from: Some(init.from.clone()),
            // A fork is its forker's own session, not a chat's.
            channel: None,
        };
        self.store()?.save_meta(&meta)?;
        let mut session = Session::fork(t, seed(), prefix, &init.from, &init.created_by);
        session.set_retry_policy(inference::retry_policy(&self.env));
        *self.loaded.borrow_mut() = Some(Loaded { session, meta });
        self.pump().wait().await?;
        let info = self.info()?;
        tenant_index::create(&self.env, &info_tenant(&self), &info).await?;
        Ok(info)
    }

    /// Entries of this session up to `through`, for a fork of it (see `session_client::prefix`).
    async fn prefix(self: &Rc<Self>, request: &PrefixRequest) -> ApiResult<PrefixPage> {
        let max = wuhu_core::archive::MAX_PAGE as u64;
        if request.limit == 0 || request.limit > max {
            return Err(ApiError::bad_request(format!(
                "limit must be between 1 and {max}"
            )));
        }
        if request.through > self.committed_cursor() {
            return Err(ApiError::bad_request("through is past the last entry"));
        }
        if request.since_cursor >= request.through {
            return Ok(PrefixPage {
                entries: Vec::new(),
                next_cursor: None,
            });
        }
        let (mut entries, _) =
            archive::read_page(self, request.since_cursor, request.limit as usize).await?;
        entries.retain(|e| e.cursor <= request.through);
        let last = entries.last().map_or(request.since_cursor, |e| e.cursor);
        Ok(PrefixPage {
            entries,
            next_cursor: (last < request.through).then_some(last),
        })
    }

    /// Checks `action` by `who` against the session's owner, creator and access
    /// (`wuhu_core::authority::session_allows`).
    pub(super) fn authorize(&self, who: &Principal, action: SessionAction<'_>) -> ApiResult<()> {
        self.authorize_as(
            who,
            action,
            "only the session's owner, its creator or an admin may do this",
        )
    }

    /// [`Actor::authorize`] with the message of its `403`.
    pub(super) fn authorize_as(
        &self,
        who: &Principal,
        action: SessionAction<'_>,
        forbidden: &str,
    ) -> ApiResult<()> {
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
        verdict_answer(verdict, forbidden)
    }
}

/// A verdict as the API answers it: a session the caller may not see is `404` (its existence is
/// never revealed), a refused action `403` with `forbidden`'s message.
pub(super) fn verdict_answer(verdict: Verdict, forbidden: &str) -> ApiResult<()> {
    match verdict {
        Verdict::Allow => Ok(()),
        Verdict::Hidden => Err(ApiError::not_found("session not found")),
        Verdict::Forbidden => Err(ApiError::new(403, "forbidden", forbidden)),
    }
}
