//! Deleting the session (`DELETE /v1/sessions/:id` from the router, `POST /dispose` from a
//! parent's deletion; decision 0017). The rules (who may, what goes with it, the steps and
//! their order) are `wuhu_core::deletion`; this module stores the mark and performs the steps.
//!
//! The mark (the `deletion` table, one row) is written before anything is deleted and is the
//! acknowledgement: from then on the session answers 404 to everything but `DELETE`, and the
//! steps run (in the request, and again from the alarm until they are all done). The last step
//! drops this actor's storage, the mark with it.

use super::routes::verdict_answer;
use std::rc::Rc;
use std::time::Duration;

use serde::Deserialize;
use wasm_bindgen_futures::spawn_local;
use worker::{Delay, SqlStorage};
use wuhu_core::authority::{self, SessionAction, SessionFacts};
use wuhu_core::calls::session::Deleted;
use wuhu_core::deletion::{self, Deletion, HostRecord, Step};
use wuhu_core::wire::runner::jobs::KILL_TOOL;
use wuhu_core::wire::{ChildLifecycle, ChildStatus};

use super::{Actor, now};
use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};
use crate::runner_calls::cancel_on_runner;
use crate::{internal, runner_client, session_client, tenant_index};
use wuhu_core::wire::runner::{DiscardWorkspacesRequest, DiscardWorkspacesResponse};

/// The alarm's retry of a deletion whose step failed (also the backstop armed with the mark).
const RETRY_MS: u64 = 10_000;
/// Object listing pages deleted per prefix in one run (1,000 keys each); more is left to the
/// next run (the alarm).
const MAX_PAGES_PER_PREFIX: usize = 50;
/// Test-only fault injection: when this variable is `fail_objects`, the objects step fails (as
/// an R2 outage would), so the deletion answers 202 and is left to the alarm. Unset in
/// `wrangler.toml`; tests pass it with `--var`.
const FAULT_VAR: &str = "WUHU_FAULT_DELETION";
/// How long the objects step waits for a write or an archive flush that was under way when the
/// session was marked (it retries from the alarm after that).
const WRITES_SETTLE: Duration = Duration::from_secs(10);

/// The `deletion` table: the mark, one JSON row.
pub(crate) struct DeletionStore {
    sql: SqlStorage,
}

#[derive(Deserialize)]
struct MarkRow {
    state: String,
}

impl DeletionStore {
    pub(crate) fn open(sql: SqlStorage) -> worker::Result<DeletionStore> {
        sql.exec(
            "CREATE TABLE IF NOT EXISTS deletion (k INTEGER PRIMARY KEY CHECK (k = 0), state TEXT NOT NULL)",
            None,
        )?;
        Ok(DeletionStore { sql })
    }

    fn load(&self) -> worker::Result<Option<Deletion>> {
        let rows: Vec<MarkRow> = self
            .sql
            .exec("SELECT state FROM deletion WHERE k = 0", None)?
            .to_array()?;
        Ok(rows
            .into_iter()
            .next()
            .and_then(|r| serde_json::from_str(&r.state).ok()))
    }

    fn save(&self, deletion: &Deletion) -> ApiResult<()> {
        let json =
            serde_json::to_string(deletion).map_err(|e| ApiError::internal(e.to_string()))?;
        self.sql.exec(
            "INSERT INTO deletion (k, state) VALUES (0, ?) ON CONFLICT(k) DO UPDATE SET state = excluded.state",
            vec![json.into()],
        )?;
        Ok(())
    }
}

impl Actor {
    fn deletion_store(&self) -> ApiResult<&DeletionStore> {
        self.deletion
            .deletion_store
            .as_ref()
            .map_err(|e| ApiError::internal(format!("storage unavailable: {e}")))
    }

    /// Saves on which runner connection each environment was validated (with the attachments).
    pub(super) fn save_validated(&self) {
        let validated = self.environments.validated.borrow().clone();
        if let Ok(store) = self.store()
            && let Err(e) = store.save_validated(&validated)
        {
            worker::console_error!("saving the validated epochs failed: {e}");
        }
    }

    /// Records the runner of a new attachment among the hosts of the session's workspaces
    /// (`deletion::record_workspace_host`), before the attachment is applied.
    pub(super) fn record_workspace_host(&self, attachment: &wuhu_core::environments::Attachment) {
        let Ok(store) = self.store() else {
            return;
        };
        let mut hosts = store.load_workspace_hosts().unwrap_or_default();
        match deletion::record_workspace_host(&mut hosts, attachment) {
            HostRecord::Added => {
                if let Err(e) = store.save_workspace_hosts(&hosts) {
                    worker::console_error!("saving the workspace hosts failed: {e}");
                }
            }
            HostRecord::Unchanged => {}
            HostRecord::Full => worker::console_log!(
                "session {}: runner {:?} of {} is not recorded as a workspace host ({} are): its copy is not discarded with the session",
                self.session_id(),
                attachment.runner,
                attachment.runner_owner,
                deletion::MAX_WORKSPACE_HOSTS
            ),
        }
    }

    /// The deletion in progress, if the session is marked.
    pub(super) fn deletion_mark(&self) -> ApiResult<Option<Deletion>> {
        // Dropped storage has no tables left to read.
        if self.deletion.storage_dropped.get() {
            return Ok(None);
        }
        Ok(self.deletion_store()?.load()?)
    }

    /// Before a session is created in an actor whose storage a deletion dropped in this
    /// isolate (an id derived from a chat thread, created again): the tables come back, empty.
    pub(super) fn recreate_tables(&self) -> ApiResult<()> {
        if !self.deletion.storage_dropped.replace(false) {
            return Ok(());
        }
        let sql = self.state.storage().sql();
        self.store()?.recreate()?;
        super::approvals::ApprovalStore::open(sql.clone())?;
        super::children::ChildStore::open(sql.clone())?;
        crate::runner_calls::RunnerCalls::open(sql.clone());
        super::jobs::JobStore::open(sql.clone())?;
        DeletionStore::open(sql)?;
        Ok(())
    }

    /// `Delete` of a person (`identity`: the owner or an admin) and `Dispose` of another
    /// session's deletion (`None`: a parent's, or the forked session's; no person is checked).
    /// Answers `Finished` (204) once every step is done, `Continuing` (202) when one failed or
    /// another request is performing them (the alarm finishes), 404 when there is nothing
    /// (left) to delete. Forks never refuse a deletion: they go with it (decision 0033).
    pub(super) async fn delete_route(
        self: &Rc<Self>,
        identity: Option<&Identity>,
    ) -> ApiResult<Deleted> {
        if let Some(marked) = self.deletion_mark()? {
            // Already marked: whoever may delete it sees the deletion go on.
            if let Some(identity) = identity {
                let facts = SessionFacts {
                    owner: &marked.owner,
                    created_by: &marked.created_by,
                    access: marked.access,
                };
                verdict_answer(
                    authority::session_allows(&identity.principal(), facts, SessionAction::Delete),
                    DELETE_FORBIDDEN,
                )?;
            }
        } else {
            if !self.ensure_loaded()? {
                return Err(ApiError::not_found("session not found"));
            }
            if let Some(identity) = identity {
                self.authorize_as(
                    &identity.principal(),
                    SessionAction::Delete,
                    DELETE_FORBIDDEN,
                )?;
            }
            // The usage of its last steps, when a report of them still waits out its delay
            // (decision 0022): the index keeps a deleted session's usage, and once hidden the
            // session cannot report it.
            self.usage_report_sent().await;
            if let Err(e) = self.report_usage().await {
                worker::console_error!("reporting usage before a deletion failed: {}", e.message);
            }
            // A concurrent request may have marked it during the awaits.
            if self.deletion_mark()?.is_none() {
                let requested_by = identity.map_or("wuhu", |i| i.sub.as_str());
                self.mark(requested_by).await?;
            }
        }
        if self.finish_deletion().await {
            Ok(Deleted::Finished)
        } else {
            Ok(Deleted::Continuing)
        }
    }

    /// Writes the mark and hides the session: nothing of it is read, written or streamed again.
    async fn mark(self: &Rc<Self>, requested_by: &str) -> ApiResult<()> {
        let cursor = self.committed_cursor();
        let deletion = self
            .with_loaded(|l| Deletion {
                session_id: l.meta.id.clone(),
                tenant: l.meta.tenant.clone(),
                owner: l.session.owner().unwrap_or(&l.meta.created_by).to_string(),
                created_by: l.meta.created_by.clone(),
                access: l.meta.access,
                parent_id: l.meta.lineage.parent_id.clone(),
                detached: l.meta.lineage.detached,
                title: l.meta.title.clone(),
                cursor,
                spent: Some(l.session.total_spent()),
                requested_by: requested_by.to_string(),
                steps_done: 0,
            })
            .ok_or_else(|| ApiError::not_found("session not found"))?;
        self.deletion_store()?.save(&deletion)?;
        worker::console_log!(
            "deleting session {} of {} (asked by {requested_by})",
            deletion.session_id,
            deletion.tenant
        );
        self.hide();
        // The backstop, set before any step runs (and before the answer): a deletion
        // interrupted from here on finishes from the alarm.
        self.bookkeeping
            .alarm_armed_for
            .set(Some(now().0 + RETRY_MS));
        self.state.storage().set_alarm(RETRY_MS as i64).await?;
        Ok(())
    }

    /// Drops the session from memory and refuses every later write of this isolate; ends the
    /// follow streams; fails the writes that waited.
    fn hide(&self) {
        self.deletion.deleting.set(true);
        *self.loaded.borrow_mut() = None;
        *self.turn.tail.borrow_mut() = None;
        self.writes.unarchived.set(None);
        for batch in self.writes.pending_writes.borrow_mut().drain(..) {
            if let Some(done) = batch.done {
                let _ = done.send(Err(ApiError::not_found("session not found")));
            }
        }
        self.clients.followers.borrow_mut().end_deleted();
    }

    /// Performs the steps left. Returns whether the deletion is finished; `false` when a step
    /// failed (the alarm retries) or another request is performing them.
    pub(super) async fn finish_deletion(self: &Rc<Self>) -> bool {
        if self.deletion.deletion_running.replace(true) {
            return false;
        }
        // In a fresh isolate (the alarm after a restart) nothing is hidden yet.
        self.hide();
        let result = self.run_steps().await;
        self.deletion.deletion_running.set(false);
        match result {
            Ok(()) => true,
            Err(e) => {
                worker::console_error!("a deletion step failed (retried): {}", e.message);
                // Awaited: a retry must not depend on a task that a crash would lose.
                self.bookkeeping
                    .alarm_armed_for
                    .set(Some(now().0 + RETRY_MS));
                if let Err(e) = self.state.storage().set_alarm(RETRY_MS as i64).await {
                    worker::console_error!("setting the deletion's alarm failed: {e}");
                }
                false
            }
        }
    }

    async fn run_steps(self: &Rc<Self>) -> ApiResult<()> {
        loop {
            let Some(mut deletion) = self.deletion_mark()? else {
                return Ok(());
            };
            let Some(step) = deletion.next_step() else {
                return Ok(());
            };
            self.perform_step(&deletion, step).await?;
            if step == Step::DropStorage {
                return Ok(());
            }
            deletion.handle_step_done(step);
            self.deletion_store()?.save(&deletion)?;
        }
    }

    async fn perform_step(self: &Rc<Self>, deletion: &Deletion, step: Step) -> ApiResult<()> {
        let (env, tenant, id) = (&self.env, &deletion.tenant, &deletion.session_id);
        match step {
            Step::Stop => {
                // After a restart the mark is all there is: hide again.
                self.hide();
                self.in_flight.tasks.abort_all();
                self.approvals.approval_waiters.borrow_mut().clear();
                let mut calls = self.in_flight.runner_calls.take_all();
                calls.extend(self.in_flight.runner_calls.orphans());
                for call in calls {
                    spawn_local(cancel_on_runner(
                        env.clone(),
                        tenant.clone(),
                        self.in_flight.runner_calls.clone(),
                        call,
                    ));
                }
                // Background jobs are killed; one whose runner is away ends with that runner's
                // process.
                let running = self
                    .jobs
                    .job_store
                    .as_ref()
                    .map(|s| s.list())
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|r| !r.state.is_finished());
                for record in running {
                    if let Err(e) =
                        runner_client::ask_job(env, tenant, &deletion.owner, id, &record, KILL_TOOL)
                            .await
                    {
                        worker::console_error!(
                            "killing job {} of a deleted session failed: {}",
                            record.job_id,
                            e.message
                        );
                    }
                }
                Ok(())
            }
            Step::Unlist => tenant_index::remove(env, tenant, id).await,
            Step::DisposeChildren => {
                // Its children, and its forks whoever made them: a fork reads its history from
                // this session, which is going (decision 0033). The index still lists the forks
                // (this session's own row went with `Unlist`).
                let mut doomed: Vec<String> =
                    self.children_list().into_iter().map(|c| c.id).collect();
                let rows = tenant_index::tree(env, tenant).await?;
                let forks = deletion::forks_of(id, &rows);
                if !forks.is_empty() {
                    worker::console_log!(
                        "deleting session {id} of {tenant} takes its {} fork(s) with it",
                        forks.len()
                    );
                }
                doomed.extend(forks);
                let disposals = doomed.iter().map(|doomed| async move {
                    match session_client::dispose(env, tenant, doomed).await {
                        Err(e) if e.status != 404 => Err(e),
                        _ => Ok(()),
                    }
                });
                futures::future::join_all(disposals)
                    .await
                    .into_iter()
                    .collect::<ApiResult<Vec<()>>>()
                    .map(|_| ())
            }
            Step::TellParent => {
                let Some(parent) = &deletion.parent_id else {
                    return Ok(());
                };
                let status = ChildStatus {
                    id: id.clone(),
                    title: deletion.title.clone(),
                    detached: deletion.detached,
                    lifecycle: ChildLifecycle::Disposed,
                    cursor: deletion.cursor,
                    spent: deletion.spent,
                    branch: None,
                    head: None,
                };
                match session_client::child_event(env, tenant, parent, &status).await {
                    // The parent is gone (or being deleted): nobody to tell.
                    Err(e) if e.status != 404 => return Err(e),
                    _ => {}
                }
                let granted = tenant_index::gate_release(env, tenant, id, None).await?;
                session_client::start_granted(env, tenant, granted).await;
                Ok(())
            }
            Step::DeleteObjects => {
                if env
                    .var(FAULT_VAR)
                    .is_ok_and(|v| v.to_string() == "fail_objects")
                {
                    return Err(ApiError::new(
                        503,
                        "unavailable",
                        format!("deleting objects failed: injected by {FAULT_VAR}"),
                    ));
                }
                let deadline = now().0 + WRITES_SETTLE.as_millis() as u64;
                while self.writes.writing.get() || self.writes.flushing.get() {
                    if now().0 > deadline {
                        return Err(ApiError::new(
                            503,
                            "unavailable",
                            "a write of the deleted session is still under way",
                        ));
                    }
                    Delay::from(Duration::from_millis(100)).await;
                }
                let bucket = env.bucket("ARCHIVE")?;
                for prefix in deletion::object_prefixes(tenant, id) {
                    delete_prefix(&bucket, &prefix).await?;
                }
                // Its images leave this isolate's cache too (other isolates' copies are found
                // only through this session's references, and age out).
                let dropped = crate::blob_store::forget_session_images(tenant, id);
                worker::console_log!(
                    "deleted the objects of session {id} of {tenant}; {dropped} cached images dropped"
                );
                Ok(())
            }
            Step::DiscardWorkspaces => {
                let hosts = self.store()?.load_workspace_hosts()?;
                if hosts.is_empty() {
                    return Ok(());
                }
                let request = DiscardWorkspacesRequest {
                    session_id: id.clone(),
                    hosts,
                };
                let answer: DiscardWorkspacesResponse = internal::call(
                    &internal::hub(env, tenant)?,
                    &crate::identity::Identity::system(tenant),
                    &wuhu_core::calls::hub::Discard(request),
                )
                .await?;
                worker::console_log!(
                    "session {id} of {tenant}: {} runner(s) will discard its workspaces ({} told now){}",
                    answer.pending,
                    answer.sent,
                    if answer.unknown.is_empty() {
                        String::new()
                    } else {
                        format!(
                            "; {} are no runners of the tenant any more",
                            answer.unknown.len()
                        )
                    }
                );
                Ok(())
            }
            Step::DropStorage => {
                let storage = self.state.storage();
                storage.delete_alarm().await?;
                storage.delete_all().await?;
                self.deletion.storage_dropped.set(true);
                self.bookkeeping.alarm_armed_for.set(None);
                self.environments.attachments.borrow_mut().clear();
                self.environments.validated.borrow_mut().clear();
                self.writes.committed_cursor.set(0);
                worker::console_log!("deleted session {id} of {tenant}");
                Ok(())
            }
        }
    }
}

/// Deletes every object under `prefix`, a listing page at a time.
async fn delete_prefix(bucket: &worker::Bucket, prefix: &str) -> ApiResult<()> {
    for _ in 0..MAX_PAGES_PER_PREFIX {
        let page = bucket.list().prefix(prefix).limit(1000).execute().await?;
        let keys: Vec<String> = page.objects().iter().map(|o| o.key()).collect();
        if keys.is_empty() {
            return Ok(());
        }
        bucket.delete_multiple(keys).await?;
    }
    Err(ApiError::new(
        503,
        "unavailable",
        format!("more objects under {prefix} remain"),
    ))
}

/// The `403` of a `DELETE` by a member who may read the session but not delete it.
const DELETE_FORBIDDEN: &str = "only the session's owner or an admin may delete it";
