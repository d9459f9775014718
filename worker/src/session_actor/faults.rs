//! Test-only fault points of a child's end (`WUHU_FAULT_LIFECYCLE`, never set in a deployment):
//! the actor behaves as if its isolate were lost at a named point, so
//! `tests/tests/lifecycle_faults.rs` can kill the server there. A module of its own so the
//! lifecycle code (`children`) does not reach into the task bookkeeping (`tasks`).

use std::rc::Rc;

use super::Actor;

/// Test-only (never set in a deployment's configuration): names a point of a child's end at
/// which its actor behaves as if its isolate were lost (`Fault`). Read by the fault tests of
/// `tests/tests/lifecycle_faults.rs`.
pub(crate) const FAULT_VAR: &str = "WUHU_FAULT_LIFECYCLE";

/// The points of a child's end a fault test may stop at (`FAULT_VAR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// A settling is about to be committed.
    BeforeCommit,
    /// A change and its outbox rows are committed; nothing is delivered yet.
    AfterCommit,
    /// The parent committed a report; the child did not take the acknowledgement.
    AfterDelivery,
    /// The parent was told; the gate slot is about to be released.
    BeforeRelease,
    /// Not a crash: every release is dropped as if it had been sent (the gate's reconciliation
    /// must free the slot).
    LoseRelease,
}

impl Fault {
    pub(super) fn name(self) -> &'static str {
        match self {
            Fault::BeforeCommit => "before_commit",
            Fault::AfterCommit => "after_commit",
            Fault::AfterDelivery => "after_delivery",
            Fault::BeforeRelease => "before_release",
            Fault::LoseRelease => "lose_release",
        }
    }
}

pub(super) fn fault_is(env: &worker::Env, point: Fault) -> bool {
    env.var(FAULT_VAR)
        .is_ok_and(|v| v.to_string() == point.name())
}

/// What a frozen actor (`Actor::fault_point`) answers.
pub(super) fn frozen_response() -> worker::Response {
    crate::http::ApiError::new(
        503,
        "unavailable",
        "this actor stopped at a test fault point",
    )
    .into_response()
}

impl Actor {
    /// Test-only: whether `point` is the fault `WUHU_FAULT_LIFECYCLE` names, for a child
    /// session. If so, the actor freezes as if its isolate were lost there: it logs a
    /// `fault_point` line (the test kills the server when it sees it), drops its tasks and its
    /// loaded session, and answers nothing more in this isolate.
    pub(super) fn fault_point(self: &Rc<Self>, point: Fault) -> bool {
        if !fault_is(&self.env, point) || self.lineage().parent_id.is_none() {
            return false;
        }
        let session = self.session_id();
        worker::console_log!(
            "{}",
            serde_json::json!({"event": "fault_point", "point": point.name(), "session": session})
        );
        self.lifecycle.frozen.set(true);
        self.abandon_tasks();
        *self.loaded.borrow_mut() = None;
        true
    }
}
