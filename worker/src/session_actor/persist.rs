//! Persistence of the session: loading it, and committing each drain of its effects (entries,
//! queue rows, meta, checkpoint) in one transaction before anything of it is performed.
//!
//! A drain whose entries are all small commits synchronously inside [`Actor::pump`]. A drain
//! with an entry stored out of line first writes that entry's object to R2; it and every drain
//! after it then wait in order in `pending_writes` and commit from a writer task. Nothing is
//! broadcast, started or acknowledged before its commit (`/enqueue` awaits it). A failed write
//! drops the loaded session (memory never runs ahead of storage), aborts this isolate's tasks,
//! fails every waiting drain, and arms the alarm, which reloads the session from SQLite with a
//! visible notice.

use std::rc::Rc;

use wasm_bindgen_futures::spawn_local;
use wuhu_core::out_of_line;
use wuhu_core::session::{Effect, Millis, Phase, Session};
use wuhu_core::wire::Status;

use super::blob_io::{self, storage_error};
use super::store::{EntryRow, Writes};
use super::{Actor, Loaded, now, seed, tasks};
use crate::http::{ApiError, ApiResult};

/// One drain of the session's effects with everything to write for it, taken at drain time so
/// that a later drain cannot leak into it.
pub(super) struct Batch {
    pub(super) effects: Vec<Effect>,
    pub(super) writes: Writes,
    /// Objects of out-of-line entries, written before `writes`.
    pub(super) blobs: Vec<out_of_line::Blob>,
    /// `(row bytes, entry bytes)` of each appended entry, in order.
    pub(super) sizes: Vec<(usize, usize)>,
    /// The newest cursor the batch appends.
    pub(super) writes_cursor: Option<u64>,
    /// The batch writes lifecycle events into the child's outbox.
    pub(super) outbox_written: bool,
    /// The batch settles the child (idle, failed, stopped): a fault point.
    pub(super) settles: bool,
    /// A parent's records of its children the batch writes (shown to followers once committed).
    pub(super) children: Vec<wuhu_core::wire::ChildStatus>,
    pub(super) deadline: Option<Millis>,
    pub(super) status: Status,
    /// Told the outcome when the batch is committed or failed.
    pub(super) done: Option<futures::channel::oneshot::Sender<ApiResult<()>>>,
}

/// The outcome of one [`Actor::pump`]: known at once, or when the writer task gets to it.
/// Dropping it is fine: a failure is handled (and made visible) either way.
pub(crate) struct Committed(CommittedState);

enum CommittedState {
    Done(ApiResult<()>),
    Waiting(futures::channel::oneshot::Receiver<ApiResult<()>>),
}

impl Committed {
    pub(super) fn done(result: ApiResult<()>) -> Committed {
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

impl Actor {
    /// Loads the session from SQLite if needed. Returns whether the session exists.
    /// A freshly loaded session with work in flight is resumed: this isolate has no task
    /// running for it, so the work was interrupted.
    pub(crate) fn ensure_loaded(self: &Rc<Self>) -> ApiResult<bool> {
        if self.loaded.borrow().is_some() {
            return Ok(true);
        }
        // A session marked for deletion does not exist for anyone (decision 0017).
        if self.deletion.deleting.get()
            || self.deletion.storage_dropped.get()
            || self.deletion_mark()?.is_some()
        {
            return Ok(false);
        }
        // A writer task still finishing batches of a dropped session must not race a reload.
        if self.writes.writing.get() {
            return Err(storage_error(
                "the session is recovering from a failed write; retry shortly",
            ));
        }
        let Some(stored) = self.store()?.load()? else {
            return Ok(false);
        };
        *self.environments.attachments.borrow_mut() = self.store()?.load_attachments()?;
        *self.environments.validated.borrow_mut() = self.store()?.load_validated()?;
        let t = now();
        let mut session = Session::restore(stored.checkpoint, stored.queue, seed());
        session.set_retry_policy(super::inference::retry_policy(&self.env));
        // What the children spent is what their newest reports say (the `children` table).
        session.handle_children_spent(wuhu_core::orchestration::children_spent(
            &self.children_list(),
        ));
        if session.handle_stored_cursor(t, stored.newest_cursor) {
            worker::console_error!(
                "checkpoint was behind the stored transcript (newest cursor {}); repaired",
                stored.newest_cursor
            );
        }
        if let Some(message) = self.writes.storage_failure.borrow_mut().take() {
            session.handle_storage_failure(t, &message);
        }
        let in_flight = session.checkpoint().phase != Phase::Idle || !session.queue().is_empty();
        if in_flight {
            session.handle_resume(t);
        }
        self.writes.committed_cursor.set(stored.newest_cursor);
        *self.loaded.borrow_mut() = Some(Loaded {
            session,
            meta: stored.meta,
        });
        // One line per load from storage: a wake after an eviction is otherwise invisible.
        let line = serde_json::json!({"event": "session_loaded", "session": self.session_id()});
        worker::console_log!("{line}");
        // Whatever runner calls the previous isolate's tasks left running are cancelled before
        // the resumed work starts, so a resumed step never races its predecessor's command.
        tasks::cancel_orphans(self);
        // Pumps what the restore produced (notices, resumed work). Its failure drops the
        // session again; the caller must not act on it.
        if let Committed(CommittedState::Done(Err(e))) = self.pump() {
            return Err(e);
        }
        // A child's lifecycle events that a lost isolate left undelivered go now.
        self.kick_outbox();
        Ok(true)
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
        if !self.writes.writing.get() && batch.blobs.is_empty() {
            return Committed::done(self.commit(batch));
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        let mut batch = batch;
        batch.done = Some(tx);
        self.writes.pending_writes.borrow_mut().push_back(batch);
        if !self.writes.writing.replace(true) {
            spawn_local(write_pending(self.clone()));
        }
        Committed(CommittedState::Waiting(rx))
    }

    /// Waits until every batch drained so far is committed; the failure of one that was not.
    pub(crate) async fn settled(self: &Rc<Self>) -> ApiResult<()> {
        if !self.writes.writing.get() {
            return Ok(());
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        self.writes.settle_waiters.borrow_mut().push(tx);
        rx.await
            .unwrap_or_else(|_| Err(storage_error("the session's writes were abandoned")))
    }

    /// Takes the session's effects and everything to write for them.
    pub(super) fn drain(&self) -> ApiResult<Option<Batch>> {
        let mut loaded = self.loaded.borrow_mut();
        let Some(loaded) = loaded.as_mut() else {
            return Ok(None);
        };
        let mut effects = Vec::new();
        while let Some(effect) = loaded.session.poll_effect() {
            effects.push(effect);
        }
        // A parent's records of its children changed by reports commit with this drain (and
        // the messages those reports queued), even when it has no effects of its own.
        let children = self.lifecycle.pending_children.take();
        if effects.is_empty() && children.is_empty() {
            return Ok(None);
        }
        let mut writes = Writes::default();
        for child in &children {
            writes.children.push((
                child.id.clone(),
                serde_json::to_string(child)
                    .map_err(|e| ApiError::internal(format!("child serialisation failed: {e}")))?,
            ));
        }
        // A child's change of state goes into its outbox in the same commit
        // (`wuhu_core::lifecycle`).
        let mut settles = false;
        if let Some(lifecycle) = wuhu_core::orchestration::turn_outcome(&effects)
            && loaded.meta.lineage.parent_id.is_some()
        {
            settles = lifecycle.is_settled();
            let status = wuhu_core::wire::ChildStatus {
                id: loaded.meta.id.clone(),
                title: loaded.meta.title.clone(),
                detached: loaded.meta.lineage.detached,
                lifecycle,
                cursor: loaded.session.last_cursor(),
                spent: Some(loaded.session.total_spent()),
                branch: None,
                head: None,
            };
            let pushed = self.store()?.outbox()?.push(&status, now().0);
            writes.outbox_inserts = pushed.insert;
            writes.outbox_deletes = pushed.delete;
        }
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
                Effect::QueueDelete { id, .. } => {
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
        writes.usage_reported_through = self.bookkeeping.usage_reported_unsaved.take();
        writes.checkpoint = serde_json::to_string(loaded.session.checkpoint())
            .map_err(|e| ApiError::internal(format!("checkpoint serialisation failed: {e}")))?;
        Ok(Some(Batch {
            writes_cursor: writes.entries.last().map(|e| e.cursor),
            outbox_written: !writes.outbox_inserts.is_empty(),
            settles,
            children,
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
    pub(super) fn commit(self: &Rc<Self>, mut batch: Batch) -> ApiResult<()> {
        let done = batch.done.take();
        // A batch drained before the session was marked for deletion is not written.
        if self.deletion.deleting.get() {
            let gone = ApiError::not_found("session not found");
            if let Some(done) = done {
                let _ = done.send(Err(gone.clone()));
            }
            return Err(gone);
        }
        // Test-only: the isolate is lost before a child's settling is committed.
        if batch.settles && self.fault_point(super::faults::Fault::BeforeCommit) {
            let lost = storage_error("lost before the commit (test fault)");
            if let Some(done) = done {
                let _ = done.send(Err(lost.clone()));
            }
            return Err(lost);
        }
        let result = self
            .store()
            .and_then(|store| Ok(store.commit(std::mem::take(&mut batch.writes))?))
            .map_err(|e| storage_error(format!("saving the session failed: {}", e.message)));
        match &result {
            Ok(()) => {
                self.writes.commits.set(self.writes.commits.get() + 1);
                if let Some(newest) = batch.writes_cursor {
                    self.writes.committed_cursor.set(newest);
                }
                self.writes.write_failures.set(0);
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
    pub(super) fn write_failed(self: &Rc<Self>, message: &str) {
        worker::console_error!("{message}; the session is reloaded from storage");
        tasks::abandon_all(self);
        *self.loaded.borrow_mut() = None;
        *self.turn.tail.borrow_mut() = None;
        self.writes.unarchived.set(None);
        *self.writes.storage_failure.borrow_mut() = Some(message.to_string());
        for batch in self.writes.pending_writes.borrow_mut().drain(..) {
            if let Some(done) = batch.done {
                let _ = done.send(Err(storage_error(format!(
                    "an earlier write failed ({message})"
                ))));
            }
        }
        for waiter in self.writes.settle_waiters.borrow_mut().drain(..) {
            let _ = waiter.send(Err(storage_error(format!(
                "an earlier write failed ({message})"
            ))));
        }
        let failures = self.writes.write_failures.get().saturating_add(1);
        self.writes.write_failures.set(failures);
        let backoff = (1000u64 << failures.min(6)).min(60_000);
        self.bookkeeping.alarm_armed_for.set(None);
        self.arm_alarm(Millis(now().0 + backoff));
    }
}

/// The writer task: writes each waiting batch's objects, then commits it, in order. Runs while
/// batches wait; a failure fails every batch behind it (see [`Actor::write_failed`]).
async fn write_pending(actor: Rc<Actor>) {
    loop {
        let Some(batch) = actor.writes.pending_writes.borrow_mut().pop_front() else {
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
    actor.writes.writing.set(false);
    for waiter in actor.writes.settle_waiters.borrow_mut().drain(..) {
        let _ = waiter.send(Ok(()));
    }
}
