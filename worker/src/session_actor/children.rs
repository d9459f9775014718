//! Child sessions, the actor's side (issue 12, `docs/orchestration.md`). The rules are
//! `wuhu_core::orchestration`; this module moves their inputs and outputs:
//!
//! - as a **parent**: the `children` table (one row per spawned child, its newest status),
//!   `POST /child_event` (a child reports: recorded, shown to followers as `child_status`, and
//!   the reports that matter queued on the `system` lane), and the stop cascade;
//! - as a **child**: delivering its lifecycle outbox (`wuhu_core::lifecycle`: each committed
//!   change of state, written by `persist` with the change) to the parent, and releasing its
//!   gate slot after telling it of a settling, head first, retried by the alarm until
//!   acknowledged; taking input through the tenant's concurrency gate (`/child_input`, the task
//!   at `/init`), keeping input that waits for a slot in its meta (`pending`) until `/start` or
//!   its alarm finds a slot; answering the gate's reconciliation (`/slot_held`).

use std::rc::Rc;

use serde::Deserialize;
use wasm_bindgen_futures::spawn_local;
use worker::SqlStorage;
use wuhu_core::environments;
use wuhu_core::orchestration::{self, Lineage, Slot, accept_report, parent_message};
use wuhu_core::session::Millis;
use wuhu_core::wire::{ChildLifecycle, ChildStatus, Lane, Status, StreamEvent};

use super::faults::{Fault, fault_is};
use super::store::PendingInput;
use super::{Actor, now};
use crate::http::{ApiError, ApiResult};
use crate::identity::Identity;
use crate::session_client;
use crate::tenant_index;
use crate::tool_context::Children;
use wuhu_core::calls::index::GateAnswer;
use wuhu_core::calls::session::{ChildAdmission, ChildInput, SlotHolder};
use wuhu_core::lifecycle::{AfterAttempt, Attempt, Event};

/// How many inputs a child keeps while it waits for a slot (a parent's follow-ups pile up
/// only this far).
pub(crate) const MAX_PENDING_INPUTS: usize = 16;
/// How long removing a child's worktree at its end may take (the runner runs git).
const WORKTREE_REMOVAL_TIMEOUT_MS: u64 = 60_000;
/// How often a child that waits for a slot asks the gate again (in case a `/start` was lost).
const GATE_POLL_MS: u64 = 30_000;
/// The `children` table of a parent: a child's newest status by id, in spawn order. At most
/// `orchestration::MAX_CHILDREN_PER_SESSION` rows.
pub(crate) struct ChildStore {
    sql: SqlStorage,
}

#[derive(Deserialize)]
struct StatusRow {
    status: String,
}

impl ChildStore {
    pub(crate) fn open(sql: SqlStorage) -> worker::Result<ChildStore> {
        sql.exec(
            "CREATE TABLE IF NOT EXISTS children (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, status TEXT NOT NULL)",
            None,
        )?;
        Ok(ChildStore { sql })
    }

    pub(crate) fn list(&self) -> worker::Result<Vec<ChildStatus>> {
        let rows: Vec<StatusRow> = self
            .sql
            .exec("SELECT status FROM children ORDER BY seq", None)?
            .to_array()?;
        Ok(rows
            .into_iter()
            .filter_map(|r| serde_json::from_str(&r.status).ok())
            .collect())
    }

    fn get(&self, id: &str) -> worker::Result<Option<ChildStatus>> {
        let rows: Vec<StatusRow> = self
            .sql
            .exec("SELECT status FROM children WHERE id = ?", vec![id.into()])?
            .to_array()?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|r| serde_json::from_str(&r.status).ok()))
    }

    fn put(&self, status: &ChildStatus) -> worker::Result<()> {
        let json =
            serde_json::to_string(status).map_err(|e| worker::Error::RustError(e.to_string()))?;
        self.sql.exec(
            "INSERT INTO children (id, status) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET status = excluded.status",
            vec![status.id.as_str().into(), json.into()],
        )?;
        Ok(())
    }
}

/// What a tool sees of the session's children ([`Children`]).
pub(super) struct ActorChildren {
    pub(super) actor: Rc<Actor>,
}

impl Children for ActorChildren {
    fn list(&self) -> Vec<ChildStatus> {
        self.actor.children_list()
    }

    fn record(&self, status: ChildStatus) -> Result<(), String> {
        self.actor
            .record_child(status)
            .map(|_| ())
            .map_err(|e| e.message)
    }
}

impl Actor {
    pub(super) fn lineage(&self) -> Lineage {
        self.with_loaded(|l| l.meta.lineage.clone())
            .unwrap_or_default()
    }

    pub(super) fn children_list(&self) -> Vec<ChildStatus> {
        self.child_store
            .as_ref()
            .ok()
            .and_then(|s| s.list().ok())
            .unwrap_or_default()
    }

    /// Records what is known of a child when it is newer than what was recorded, and shows it
    /// to followers. Returns whether it was newer.
    pub(super) fn record_child(&self, status: ChildStatus) -> ApiResult<bool> {
        let store = self
            .child_store
            .as_ref()
            .map_err(|e| ApiError::internal(format!("storage unavailable: {e}")))?;
        if !accept_report(store.get(&status.id)?.as_ref(), &status) {
            return Ok(false);
        }
        store.put(&status)?;
        self.broadcast(StreamEvent::ChildStatus { child: status });
        Ok(true)
    }

    /// `POST /child_event`: a child reports (from its outbox, `wuhu_core::lifecycle`). Only a
    /// recorded child is heard. A report newer than the record is recorded, and one that matters
    /// to this session queues a message on its `system` lane (which wakes it when idle), both in
    /// one commit; the answer (the child's acknowledgement) comes after it. A report delivered
    /// again finds its record and changes nothing (`accepted: false`).
    pub(super) async fn child_event(self: &Rc<Self>, status: ChildStatus) -> ApiResult<bool> {
        // The record is judged against storage, so nothing may wait for a commit meanwhile
        // (a record waiting in a batch would let a repeat through). What follows the check up
        // to the pump does not await.
        while self.writes.writing.get() {
            self.settled().await?;
        }
        let store = self
            .child_store
            .as_ref()
            .map_err(|e| ApiError::internal(format!("storage unavailable: {e}")))?;
        let Some(known) = store.get(&status.id)? else {
            return Err(ApiError::not_found("no child with this id"));
        };
        // The child's own flags are the parent's record: a report cannot change them.
        let status = ChildStatus {
            title: known.title.clone(),
            detached: known.detached,
            ..status
        };
        if !accept_report(Some(&known), &status) {
            return Ok(false);
        }
        if let Some(message) = parent_message(&status) {
            self.with_session(|s| {
                s.handle_system_message(now(), message.id, message.input, message.content)
            })
            .ok_or_else(|| ApiError::internal("session not loaded"))?
            .map_err(|e| ApiError::new(429, "queue_full", e.to_string()))?;
        }
        // What the children spent counts against this session's budget too.
        let mut children = self.children_list();
        children.retain(|c| c.id != status.id);
        children.push(status.clone());
        let spent = orchestration::children_spent(&children);
        self.with_session(|s| s.handle_children_spent(spent));
        self.lifecycle.pending_children.borrow_mut().push(status);
        // Commits the record with the message (and the children's spending with the checkpoint).
        self.pump().wait().await?;
        Ok(true)
    }

    /// Starts delivering the child's outbox unless a delivery runs.
    pub(super) fn kick_outbox(self: &Rc<Self>) {
        if self.lifecycle.outbox_sending.get() {
            return;
        }
        let actor = self.clone();
        spawn_local(async move { actor.deliver_outbox().await });
    }

    /// The alarm fired: the time it was armed for the outbox is past.
    pub(super) fn outbox_next_at_clear(&self) {
        self.lifecycle.outbox_next_at.set(None);
    }

    /// Delivers the outbox's due rows, head first, until it is empty or the head must wait;
    /// then arms the alarm for the head's next attempt. One delivery at a time.
    pub(super) async fn deliver_outbox(self: &Rc<Self>) {
        if self.lifecycle.outbox_sending.replace(true) {
            return;
        }
        self.deliver_due().await;
        self.lifecycle.outbox_sending.set(false);
    }

    async fn deliver_due(self: &Rc<Self>) {
        let Some((tenant, child, parent)) = self
            .with_loaded(|l| {
                Some((
                    l.meta.tenant.clone(),
                    l.meta.id.clone(),
                    l.meta.lineage.parent_id.clone()?,
                ))
            })
            .flatten()
        else {
            return;
        };
        let Ok(store) = self.store() else {
            return;
        };
        // Test-only: the isolate is lost after a settling's commit, before anything of it is
        // delivered.
        let settling_waits = |outbox: &wuhu_core::lifecycle::Outbox| {
            outbox.rows().iter().any(|r| {
                matches!(&r.event, Event::Report { status } if status.lifecycle.is_settled())
                    && r.attempts == 0
            })
        };
        if store.outbox().is_ok_and(|o| settling_waits(&o)) && self.fault_point(Fault::AfterCommit)
        {
            return;
        }
        loop {
            if self.lifecycle.frozen.get() || self.deletion.deleting.get() {
                return;
            }
            let mut outbox = match store.outbox() {
                Ok(outbox) => outbox,
                Err(e) => {
                    worker::console_error!("reading the lifecycle outbox failed: {e}");
                    return;
                }
            };
            let Some(row) = outbox.due(now().0).cloned() else {
                // Empty, or the head waits for its retry: the alarm fires by then.
                self.lifecycle.outbox_next_at.set(outbox.next_at());
                if let Some(at) = outbox.next_at() {
                    self.arm_alarm_by(Millis(at));
                }
                return;
            };
            let attempt = match &row.event {
                Event::Report { status } => {
                    let mut status = status.clone();
                    self.end_worktree(&mut status).await;
                    match session_client::child_event(&self.env, &tenant, &parent, &status).await {
                        Ok(_) => Attempt::Done,
                        // The parent does not know this child, or is gone: nobody to tell.
                        Err(e) if e.status == 404 => Attempt::Gone,
                        Err(e) => {
                            worker::console_error!(
                                "reporting {} to the parent failed (attempt {}): {}",
                                row.id,
                                row.attempts + 1,
                                e.message
                            );
                            Attempt::Failed
                        }
                    }
                }
                Event::ReleaseSlot { settled_at } => {
                    if self.fault_point(Fault::BeforeRelease) {
                        return;
                    }
                    if fault_is(&self.env, Fault::LoseRelease) {
                        // Test-only: the release is lost for good (reconciliation frees it).
                        Attempt::Done
                    } else {
                        match tenant_index::gate_release(
                            &self.env,
                            &tenant,
                            &child,
                            Some(*settled_at),
                        )
                        .await
                        {
                            Ok(granted) => {
                                session_client::start_granted(&self.env, &tenant, granted).await;
                                Attempt::Done
                            }
                            Err(e) => {
                                worker::console_error!(
                                    "freeing the gate slot failed (attempt {}): {}",
                                    row.attempts + 1,
                                    e.message
                                );
                                Attempt::Failed
                            }
                        }
                    }
                }
            };
            // Test-only: the isolate is lost after the parent committed, before the ack.
            if matches!(&row.event, Event::Report { status } if status.lifecycle.is_settled())
                && attempt == Attempt::Done
                && self.fault_point(Fault::AfterDelivery)
            {
                return;
            }
            let written = match outbox.attempted(&row.id, attempt, now().0) {
                None => Ok(()),
                Some(AfterAttempt::Delete) => store.outbox_delete(&row.id),
                Some(AfterAttempt::GiveUp) => {
                    worker::console_error!(
                        "gave up delivering {} after {} ms (wuhu_core::lifecycle::GIVE_UP_AFTER_MS)",
                        row.id,
                        wuhu_core::lifecycle::GIVE_UP_AFTER_MS
                    );
                    store.outbox_delete(&row.id)
                }
                Some(AfterAttempt::Retry { .. }) => {
                    match outbox.rows().iter().find(|r| r.id == row.id) {
                        Some(row) => store.outbox_update(row),
                        None => Ok(()),
                    }
                }
            };
            if let Err(e) = written {
                worker::console_error!("updating the lifecycle outbox failed: {e}");
                return;
            }
        }
    }

    /// `POST /slot_held`: the tenant index reconciles its gate. A child needs its slot while a
    /// turn runs or input waits for one. Its outbox is attempted too: the question may be the
    /// first thing that woke it after a restart.
    pub(super) fn slot_held(self: &Rc<Self>) -> SlotHolder {
        self.kick_outbox();
        let running = self
            .with_loaded(|l| l.session.status() == Status::Running || !l.meta.pending.is_empty())
            .unwrap_or(false);
        SlotHolder { running }
    }

    /// Gives this child input through the gate: a running child (it holds a slot) gets it at
    /// once; a settled one asks the gate and runs it when granted, or keeps it until a slot
    /// frees (`queued`).
    pub(super) async fn submit_input(
        self: &Rc<Self>,
        input: ChildInput,
        fresh: bool,
    ) -> ApiResult<ChildAdmission> {
        let running = self.status() == Some(Status::Running);
        if !running {
            let parent = self
                .lineage()
                .parent_id
                .ok_or_else(|| ApiError::bad_request("not a child session"))?;
            let slot = Slot {
                child: self.session_id(),
                parent,
            };
            let answer = tenant_index::gate_request(&self.env, &self.tenant(), &slot).await?;
            if let GateAnswer::Queued { position, reason } = answer {
                self.keep_pending(input)?;
                self.arm_alarm_by(Millis(now().0 + GATE_POLL_MS));
                return Ok(ChildAdmission {
                    lifecycle: ChildLifecycle::Queued { position, reason },
                    cursor: self.committed_cursor(),
                });
            }
        }
        // Construct when ready: the environment the spawn asked for is made now, with the slot.
        if !self.construct().await? {
            // Another grant is making it and queues the waiting input after: this joins it.
            self.keep_pending(input)?;
            self.arm_alarm_by(Millis(now().0 + GATE_POLL_MS));
            return Ok(ChildAdmission {
                lifecycle: ChildLifecycle::Created,
                cursor: self.committed_cursor(),
            });
        }
        // Only committed state goes into the answer: the cursor the task starts from.
        let cursor = self.committed_cursor();
        self.enqueue_inputs(vec![PendingInput::from(input)])?;
        self.pump().wait().await?;
        let lifecycle = if fresh {
            ChildLifecycle::Created
        } else {
            ChildLifecycle::Running
        };
        Ok(ChildAdmission { lifecycle, cursor })
    }

    fn keep_pending(&self, input: ChildInput) -> ApiResult<()> {
        let mut loaded = self.loaded.borrow_mut();
        let loaded = loaded
            .as_mut()
            .ok_or_else(|| ApiError::internal("session not loaded"))?;
        if loaded.meta.pending.len() >= MAX_PENDING_INPUTS {
            return Err(ApiError::new(
                429,
                "queue_full",
                format!("{MAX_PENDING_INPUTS} messages already wait for a slot"),
            ));
        }
        let mut meta = loaded.meta.clone();
        meta.pending.push(PendingInput::from(input));
        self.store()?.save_meta(&meta)?;
        loaded.meta = meta;
        Ok(())
    }

    fn enqueue_inputs(&self, inputs: Vec<PendingInput>) -> ApiResult<()> {
        for input in inputs {
            let id = uuid::Uuid::new_v4().to_string();
            self.with_session(|s| {
                s.handle_enqueue_for(
                    now(),
                    id,
                    input.lane,
                    input.author,
                    Some(input.acting_for.unwrap_or_default()),
                    input.content,
                )
            })
            .ok_or_else(|| ApiError::internal("session not loaded"))?
            .map_err(|e| ApiError::new(429, "queue_full", e.to_string()))?;
        }
        Ok(())
    }

    /// `POST /start` and the alarm: when input waits for a slot, asks the gate (asking again is
    /// harmless) and, once granted, runs it.
    pub(super) async fn start_pending(self: &Rc<Self>) -> ApiResult<()> {
        let Some(parent) = self.lineage().parent_id else {
            return Ok(());
        };
        if self.with_loaded(|l| l.meta.pending.is_empty()) != Some(false) {
            return Ok(());
        }
        let slot = Slot {
            child: self.session_id(),
            parent,
        };
        if let GateAnswer::Queued { .. } =
            tenant_index::gate_request(&self.env, &self.tenant(), &slot).await?
        {
            self.arm_alarm_by(Millis(now().0 + GATE_POLL_MS));
            return Ok(());
        }
        if !self.construct().await? {
            return Ok(());
        }
        let pending = self.take_pending()?;
        self.enqueue_inputs(pending)?;
        self.pump().wait().await
    }

    /// Construct when ready (seed 002): a child whose spawn asked for an environment
    /// (`SessionMeta::construct`) has it made now that it holds its gate slot, before any input
    /// is queued; a child that never gets a slot makes nothing. The attachment, its notices
    /// (`wuhu_environment_attached_v1`, AGENTS.md) and the cleared `construct` are saved
    /// together; an environment that cannot be made leaves the child without one and tells its
    /// model why (`wuhu_environment_unavailable_v1`), and the task runs.
    ///
    /// `Ok(false)`: another grant is making it now, and queues the waiting input when done.
    async fn construct(self: &Rc<Self>) -> ApiResult<bool> {
        let Some(resolved) = self.with_loaded(|l| l.meta.construct.clone()).flatten() else {
            return Ok(true);
        };
        if self.lifecycle.constructing.replace(true) {
            return Ok(false);
        }
        let made = crate::environment_tools::materialise(
            &self.env,
            &self.tenant(),
            &self.owner(),
            &self.session_id(),
            &resolved,
        )
        .await;
        self.lifecycle.constructing.set(false);
        let name = resolved.spec.name.clone();
        let mut made_now = None;
        let entries = match made {
            Ok(attached) => {
                made_now = Some(resolved.clone());
                // Its runner is a host of its worktree or copy: removed with the session.
                self.record_workspace_host(&attached.attachment);
                let mut attachments = self.attachments();
                attachments.retain(|a| a.name() != name);
                attachments.push(attached.attachment);
                self.store()?.save_attachments(&attachments)?;
                *self.environments.attachments.borrow_mut() = attachments;
                self.environments
                    .validated
                    .borrow_mut()
                    .insert(name, attached.epoch);
                self.save_validated();
                attached.entries
            }
            Err(e) => {
                worker::console_error!(
                    "making child {}'s environment failed: {e}",
                    self.session_id()
                );
                vec![wuhu_core::wire::EntryPayload::Message {
                    message: wuhu_core::wire::Message::CustomMessage {
                        custom_type: wuhu_core::wire::custom_types::ENVIRONMENT_UNAVAILABLE.into(),
                        content: format!(
                            "The environment {name:?} your task was given could not be made when you started, so you have none: {e}"
                        ),
                        details: Some(serde_json::json!({"environment": name, "error": e})),
                    },
                }]
            }
        };
        {
            let mut loaded = self.loaded.borrow_mut();
            let loaded = loaded
                .as_mut()
                .ok_or_else(|| ApiError::internal("session not loaded"))?;
            let mut meta = loaded.meta.clone();
            meta.construct = None;
            if made_now.is_some() {
                meta.made = made_now;
            }
            self.store()?.save_meta(&meta)?;
            loaded.meta = meta;
            loaded.session.handle_notices(now(), entries);
        }
        Ok(true)
    }

    /// One lifespan for a child and its worktree (seed 002): before a settling is reported, the
    /// worktree made for this child at its slot is removed, its branch kept, unless its
    /// definition keeps it (`orchestration::removes_worktree_at`); the report carries the
    /// branch and the commit it was at (and so does every later one). The child keeps what it
    /// needs to have a worktree made again from that branch when it is given more work (at its
    /// next slot, as at its first). A runner that cannot be reached leaves the worktree to the
    /// session's deletion (decision 0017: removed then, or when the runner returns).
    async fn end_worktree(self: &Rc<Self>, status: &mut ChildStatus) {
        if let Some(made) = self.with_loaded(|l| l.meta.made.clone()).flatten() {
            let name = made.spec.name.clone();
            let attachment = self.attachments().into_iter().find(|a| a.name() == name);
            if let Some(attachment) = attachment
                && status.lifecycle != ChildLifecycle::Disposed
                && orchestration::removes_worktree_at(
                    &status.lifecycle,
                    attachment.environment.kind,
                    made.keep_worktree,
                )
            {
                self.remove_worktree(&made, &attachment).await;
            }
        }
        if let Some(end) = self.with_loaded(|l| l.meta.worktree_end.clone()).flatten() {
            status.branch = Some(end.branch);
            status.head = end.head;
        }
    }

    async fn remove_worktree(
        self: &Rc<Self>,
        made: &wuhu_core::wire::ResolveEnvironmentResponse,
        attachment: &wuhu_core::environments::Attachment,
    ) {
        use wuhu_core::wire::runner::{
            DetachOutcome, EnvironmentSource, RunnerMessage, ServerMessage,
        };
        let message = ServerMessage::Detach {
            id: uuid::Uuid::new_v4().to_string(),
            session_id: self.session_id(),
            environment: attachment.environment.context(),
        };
        let reply = crate::runner_client::call(
            &self.env,
            &self.tenant(),
            &self.owner(),
            &attachment.runner,
            &attachment.runner_owner,
            &message,
            WORKTREE_REMOVAL_TIMEOUT_MS,
        )
        .await;
        let (branch, head) = match reply {
            Ok((
                _,
                Some(RunnerMessage::DetachResult {
                    outcome:
                        DetachOutcome::Ok {
                            branch: Some(branch),
                            head,
                            ..
                        },
                    ..
                }),
            )) => (branch, head),
            other => {
                worker::console_error!(
                    "removing child {}'s worktree on runner {:?} failed (left to its deletion): {other:?}",
                    self.session_id(),
                    attachment.runner
                );
                return;
            }
        };
        let name = attachment.name().to_string();
        let text = environments::detached_text(&name, Some(&branch), None);
        let saved = (|| -> ApiResult<()> {
            let mut attachments = self.attachments();
            attachments.retain(|a| a.name() != name);
            self.store()?.save_attachments(&attachments)?;
            *self.environments.attachments.borrow_mut() = attachments;
            self.environments.validated.borrow_mut().remove(&name);
            self.save_validated();
            let mut loaded = self.loaded.borrow_mut();
            let loaded = loaded
                .as_mut()
                .ok_or_else(|| ApiError::internal("session not loaded"))?;
            let mut meta = loaded.meta.clone();
            // More work later makes a worktree again, from the kept branch.
            let mut again = made.clone();
            if let EnvironmentSource::Worktree { base_ref, .. } = &mut again.spec.source {
                *base_ref = Some(branch.clone());
            }
            meta.construct = Some(Box::new(again));
            meta.made = None;
            meta.worktree_end = Some(super::store::WorktreeEnd {
                branch: branch.clone(),
                head: head.clone(),
            });
            self.store()?.save_meta(&meta)?;
            loaded.meta = meta;
            loaded.session.handle_notices(
                now(),
                vec![wuhu_core::wire::EntryPayload::Custom {
                    custom_type: wuhu_core::wire::custom_types::ENVIRONMENT_DETACHED.into(),
                    data: serde_json::json!({"text": text, "environment": name, "branch": branch, "head": head}),
                }],
            );
            Ok(())
        })();
        if let Err(e) = saved {
            worker::console_error!(
                "recording the removal of child {}'s worktree failed: {}",
                self.session_id(),
                e.message
            );
        }
        let _ = self.pump();
    }

    /// Drops input that waits for a slot (the child is stopped) and saves that.
    pub(super) fn take_pending(&self) -> ApiResult<Vec<PendingInput>> {
        let mut loaded = self.loaded.borrow_mut();
        let Some(loaded) = loaded.as_mut() else {
            return Ok(Vec::new());
        };
        if loaded.meta.pending.is_empty() {
            return Ok(Vec::new());
        }
        let mut meta = loaded.meta.clone();
        let pending = std::mem::take(&mut meta.pending);
        self.store()?.save_meta(&meta)?;
        loaded.meta = meta;
        Ok(pending)
    }

    /// After a stop: stops every child that is not settled and not detached, as this session's
    /// owner, and waits for their answers (each cascades to its own children).
    pub(super) async fn cascade_stop(self: &Rc<Self>) {
        let viewer = Identity {
            sub: self.owner(),
            tenant: self.tenant(),
            role: wuhu_core::authority::Role::Member,
            runner_kind: None,
        };
        let targets: Vec<String> = self
            .children_list()
            .into_iter()
            .filter(|c| c.lifecycle.is_active() && !c.detached)
            .map(|c| c.id)
            .collect();
        let stops = targets.iter().map(|id| {
            let viewer = &viewer;
            async move {
                if let Err(e) = session_client::stop(&self.env, viewer, id).await {
                    worker::console_error!("stopping child {id} failed: {}", e.message);
                }
            }
        });
        futures::future::join_all(stops).await;
    }
}

impl From<ChildInput> for PendingInput {
    fn from(input: ChildInput) -> Self {
        PendingInput {
            content: input.content,
            lane: if input.lane == Lane::Steer {
                Lane::Steer
            } else {
                Lane::FollowUp
            },
            author: input.author,
            acting_for: Some(input.acting_for),
        }
    }
}
