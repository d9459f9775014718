//! The tenant's concurrency gate of spawned sessions (`wuhu_core::orchestration::Gate`),
//! saved whole after every change.

use wuhu_core::calls::index::GateAnswer;
use wuhu_core::orchestration::{Admission, Gate, Slot};

use super::TenantIndex;
use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};

impl TenantIndex {
    fn load_gate(&self) -> ApiResult<Gate> {
        self.load_state("gate")
    }

    fn save_gate(&self, gate: &Gate) -> ApiResult<()> {
        self.save_state("gate", gate)
    }

    /// Asks the gate for a slot for `slot.child`; a spawn granted meanwhile starts.
    pub(super) fn gate_request(&self, who: &Identity, slot: Slot) -> ApiResult<GateAnswer> {
        let mut gate = self.load_gate()?;
        // Limits may have grown since the last change: whoever fits now runs.
        let granted = gate.admit(&self.limits);
        let answer = match gate.request(slot, &self.limits) {
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
        Ok(answer)
    }

    /// Frees `child`'s slot (or its place in line); the spawns granted in its stead.
    pub(super) fn gate_release(&self, child: &str) -> ApiResult<Vec<Slot>> {
        let mut gate = self.load_gate()?;
        let granted = gate.release(child, &self.limits);
        self.save_gate(&gate)?;
        Ok(granted)
    }
}
