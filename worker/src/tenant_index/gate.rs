//! The tenant's concurrency gate of spawned sessions (`wuhu_core::orchestration::Gate`),
//! saved whole after every change, and its reconciliation: while any slot is held or waited
//! for, the index's alarm asks, every `RECONCILE_EVERY_MS`, each child that has held its slot
//! longer than the grace whether it still needs it, and frees the slots of children that
//! settled or were deleted (a release lost with an isolate frees itself within
//! `LOST_RELEASE_BOUND_MS`, 60 s).

use serde::{Deserialize, Serialize};
use wuhu_core::bookkeeping::IndexAlarms;
use wuhu_core::calls::index::GateAnswer;
use wuhu_core::orchestration::{Admission, Gate, Holder, RECONCILE_EVERY_MS, Slot};

use super::TenantIndex;
use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};

/// The index's alarm timers and the tenant they run for (the alarm has no caller to say it).
#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct AlarmState {
    #[serde(default)]
    pub(super) tenant: String,
    #[serde(flatten)]
    pub(super) alarms: IndexAlarms,
}

#[derive(Deserialize)]
struct IdRow {
    id: String,
}

fn now() -> u64 {
    worker::Date::now().as_millis()
}

impl TenantIndex {
    fn load_gate(&self) -> ApiResult<Gate> {
        self.load_state("gate")
    }

    fn save_gate(&self, gate: &Gate) -> ApiResult<()> {
        self.save_state("gate", gate)
    }

    pub(super) fn load_alarms(&self) -> ApiResult<AlarmState> {
        self.load_state("alarms")
    }

    /// Saves the timers and sets the alarm for the earlier.
    pub(super) async fn save_alarms(&self, state: &AlarmState) -> ApiResult<()> {
        self.save_state("alarms", state)?;
        if let Some(at) = state.alarms.next() {
            let offset = at.saturating_sub(now()).max(1) as i64;
            self.state.storage().set_alarm(offset).await?;
        }
        Ok(())
    }

    /// Asks the gate for a slot for `slot.child`; a spawn granted meanwhile starts.
    pub(super) async fn gate_request(&self, who: &Identity, slot: Slot) -> ApiResult<GateAnswer> {
        let mut gate = self.load_gate()?;
        let now = now();
        // Limits may have grown since the last change: whoever fits now runs.
        let granted = gate.admit(&self.limits, now);
        let answer = match gate.request(slot, &self.limits, now) {
            Ok(Admission::Granted) => GateAnswer::Granted,
            Ok(Admission::Queued { position, reason }) => GateAnswer::Queued { position, reason },
            Err(full) => return Err(ApiError::new(429, "gate_full", full.to_string())),
        };
        self.save_gate(&gate)?;
        if !granted.is_empty() {
            let env = self.env.clone();
            let tenant = who.tenant.clone();
            wasm_bindgen_futures::spawn_local(async move {
                crate::session_client::start_granted(&env, &tenant, granted).await;
            });
        }
        self.keep_reconciling(&who.tenant, &gate).await?;
        Ok(answer)
    }

    /// Frees `child`'s slot (or its place in line), when granted before `granted_before` if
    /// given; the spawns granted in its stead.
    pub(super) async fn gate_release(
        &self,
        who: &Identity,
        child: &str,
        granted_before: Option<u64>,
    ) -> ApiResult<Vec<Slot>> {
        let mut gate = self.load_gate()?;
        let granted = gate.release(child, granted_before, &self.limits, now());
        self.save_gate(&gate)?;
        self.keep_reconciling(&who.tenant, &gate).await?;
        Ok(granted)
    }

    /// While the gate holds anything, a reconciliation is due within `RECONCILE_EVERY_MS`.
    async fn keep_reconciling(&self, tenant: &str, gate: &Gate) -> ApiResult<()> {
        if gate.is_empty() {
            return Ok(());
        }
        let mut state = self.load_alarms()?;
        if state.alarms.reconcile_at.is_some() && state.tenant == tenant {
            return Ok(());
        }
        state.tenant = tenant.to_string();
        state.alarms.reconcile_by(now() + RECONCILE_EVERY_MS);
        self.save_alarms(&state).await
    }

    /// One reconciliation (from the alarm): asks each child holding a slot longer than the
    /// grace whether it still needs it (a deleted one is not asked), frees the slots of those
    /// settled or gone and the places of waiting spawns deleted, starts the spawns granted in
    /// their stead. Returns whether the gate still holds anything (another pass is due).
    pub(super) async fn reconcile_gate(&self, tenant: &str) -> ApiResult<bool> {
        let gate = self.load_gate()?;
        if gate.is_empty() {
            return Ok(false);
        }
        let asked = gate.to_reconcile(now());
        let waiting: Vec<String> = gate.waiting().map(|s| s.child.clone()).collect();
        let deleted = self.deleted_among(asked.iter().chain(waiting.iter()))?;
        let questions = asked
            .iter()
            .filter(|c| !deleted.contains(c))
            .map(|child| async move {
                let holder = match crate::session_client::slot_held(&self.env, tenant, child).await
                {
                    Ok(true) => Holder::Running,
                    Ok(false) => Holder::Settled,
                    Err(e) if e.status == 404 => Holder::Gone,
                    Err(e) => {
                        worker::console_error!(
                            "asking child {child} about its gate slot failed: {}",
                            e.message
                        );
                        Holder::Unknown
                    }
                };
                (child.clone(), holder)
            });
        let mut holders = futures::future::join_all(questions).await;
        holders.extend(deleted.into_iter().map(|c| (c, Holder::Gone)));
        // The gate as it is now: it may have changed while the children were asked.
        let mut gate = self.load_gate()?;
        let done = gate.reconcile(&holders, &self.limits, now());
        self.save_gate(&gate)?;
        if !done.freed.is_empty() {
            worker::console_log!(
                "{}",
                serde_json::json!({
                    "event": "gate_reconciled",
                    "tenant": tenant,
                    "freed": done.freed,
                    "granted": done.granted.iter().map(|s| &s.child).collect::<Vec<_>>(),
                })
            );
        }
        crate::session_client::start_granted(&self.env, tenant, done.granted).await;
        Ok(!gate.is_empty())
    }

    /// Which of `ids` were deleted (the index's tombstones).
    fn deleted_among<'a>(&self, ids: impl Iterator<Item = &'a String>) -> ApiResult<Vec<String>> {
        let mut deleted = Vec::new();
        for id in ids {
            let rows: Vec<IdRow> = self
                .sql
                .exec(
                    "SELECT id FROM deleted_sessions WHERE id = ?",
                    vec![id.as_str().into()],
                )?
                .to_array()?;
            deleted.extend(rows.into_iter().map(|r| r.id));
        }
        Ok(deleted)
    }
}
