//! Child sessions, the actor's side (issue 12, `docs/orchestration.md`). The rules are
//! `wuhu_core::orchestration`; this module moves their inputs and outputs:
//!
//! - as a **parent**: the `children` table (one row per spawned child, its newest status),
//!   `POST /child_event` (a child reports: recorded, shown to followers as `child_status`, and
//!   the reports that matter queued on the `system` lane), and the stop cascade;
//! - as a **child**: reporting each committed drain's lifecycle to the parent, taking input
//!   through the tenant's concurrency gate (`/child_input`, the task at `/init`), keeping input
//!   that waits for a slot in its meta (`pending`) until `/start` or its alarm finds a slot, and
//!   freeing the slot when it settles.

use std::rc::Rc;

use serde::Deserialize;
use wasm_bindgen_futures::spawn_local;
use worker::SqlStorage;
use wuhu_core::orchestration::{self, Lineage, Slot, accept_report, parent_message};
use wuhu_core::session::{Effect, Millis};
use wuhu_core::wire::{ChildLifecycle, ChildStatus, Lane, Status, StreamEvent};

use super::store::PendingInput;
use super::{Actor, now};
use crate::http::{ApiError, ApiResult};
use crate::identity::Identity;
use crate::session_client;
use crate::tenant_index;
use crate::tool_context::Children;
use wuhu_core::calls::index::GateAnswer;
use wuhu_core::calls::session::{ChildAdmission, ChildInput};

/// How many inputs a child keeps while it waits for a slot (a parent's follow-ups pile up
/// only this far).
pub(crate) const MAX_PENDING_INPUTS: usize = 16;
/// How often a child that waits for a slot asks the gate again (in case a `/start` was lost).
const GATE_POLL_MS: u64 = 30_000;
/// Attempts at delivering one report to the parent.
const REPORT_ATTEMPTS: u32 = 4;

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

    /// `POST /child_event`: a child reports. Only a recorded child is heard; a report that
    /// matters to this session is queued on its `system` lane, which wakes it when idle.
    pub(super) async fn child_event(self: &Rc<Self>, status: ChildStatus) -> ApiResult<bool> {
        let known = self
            .child_store
            .as_ref()
            .map_err(|e| ApiError::internal(format!("storage unavailable: {e}")))?
            .get(&status.id)?;
        let Some(known) = known else {
            return Err(ApiError::not_found("no child with this id"));
        };
        // The child's own flags are the parent's record: a report cannot change them.
        let status = ChildStatus {
            title: known.title.clone(),
            detached: known.detached,
            ..status
        };
        if !self.record_child(status.clone())? {
            return Ok(false);
        }
        // What the children spent counts against this session's budget too.
        let spent = orchestration::children_spent(&self.children_list());
        self.with_session(|s| s.handle_children_spent(spent));
        if let Some(message) = parent_message(&status) {
            self.with_session(|s| {
                s.handle_system_message(now(), message.id, message.input, message.content)
            })
            .ok_or_else(|| ApiError::internal("session not loaded"))?
            .map_err(|e| ApiError::new(429, "queue_full", e.to_string()))?;
        }
        // Also saves the children's spending with the checkpoint.
        self.pump().wait().await?;
        Ok(true)
    }

    /// After a committed drain of a child: tells the parent what it means (running, idle with
    /// the final text, failed, stopped) and, once settled, frees the child's slot at the gate
    /// and starts the spawns that were waiting for it.
    pub(super) fn report_drain(self: &Rc<Self>, effects: &[Effect]) {
        let Some(lifecycle) = orchestration::turn_outcome(effects) else {
            return;
        };
        let Some((parent, status)) = self
            .with_loaded(|l| {
                let parent = l.meta.lineage.parent_id.clone()?;
                Some((
                    parent,
                    ChildStatus {
                        id: l.meta.id.clone(),
                        title: l.meta.title.clone(),
                        detached: l.meta.lineage.detached,
                        lifecycle,
                        cursor: l.session.last_cursor(),
                        spent: Some(l.session.total_spent()),
                    },
                ))
            })
            .flatten()
        else {
            return;
        };
        let actor = self.clone();
        spawn_local(async move {
            let tenant = actor.tenant();
            let settled = status.lifecycle.is_settled();
            let mut delay_ms = 500;
            for attempt in 1..=REPORT_ATTEMPTS {
                match session_client::child_event(&actor.env, &tenant, &parent, &status).await {
                    Ok(_) => break,
                    // The parent does not know this child (never recorded): nobody to tell.
                    Err(e) if e.status == 404 => break,
                    Err(e) => {
                        worker::console_error!(
                            "reporting to the parent failed (attempt {attempt}): {}",
                            e.message
                        );
                        worker::Delay::from(std::time::Duration::from_millis(delay_ms)).await;
                        delay_ms *= 4;
                    }
                }
            }
            // After the report: the parent hears that this child settled before it hears that
            // the spawn waiting for this slot runs.
            if settled {
                actor.release_slot().await;
            }
        });
    }

    /// Frees this child's slot (or its place in line) and starts the spawns now granted.
    async fn release_slot(self: &Rc<Self>) {
        let tenant = self.tenant();
        let child = self.session_id();
        match tenant_index::gate_release(&self.env, &tenant, &child).await {
            Ok(granted) => session_client::start_granted(&self.env, &tenant, granted).await,
            Err(e) => worker::console_error!("freeing the gate slot failed: {}", e.message),
        }
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
        let pending = self.take_pending()?;
        self.enqueue_inputs(pending)?;
        self.pump().wait().await
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
