//! Child sessions on the wire (issue 12, `docs/orchestration.md`): a child's lifecycle as its
//! parent records it, shows it in `GET /v1/sessions/:id` (`children`) and streams it to
//! followers (`child_status`), and the internal bodies between a parent's and a child's actors.

use serde::{Deserialize, Serialize};

/// Where a child is in its lifecycle. The order of the variants is the order a child passes
/// through them in one turn (see `wuhu_core::orchestration::lifecycle_rank`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ChildLifecycle {
    /// The parent is creating it.
    Spawning,
    /// It exists and waits at the concurrency gate for a slot.
    Queued {
        /// 1-based place among the spawns waiting in the tenant.
        position: u32,
        /// Why it waits (which limit is reached), in words.
        reason: String,
    },
    /// It exists and holds a slot; its task is about to run.
    Created,
    /// A turn runs.
    Running,
    /// A turn ended and the child waits for input.
    Idle {
        /// The text of its last assistant message (cut to `MAX_FINAL_TEXT_BYTES`), if any.
        #[serde(default, rename = "finalText", skip_serializing_if = "Option::is_none")]
        final_text: Option<String>,
    },
    /// A turn ended because the LLM failed for good.
    Failed {
        /// What failed.
        message: String,
    },
    /// It was stopped (by a person, its parent, or a cascade).
    Stopped,
    /// It was deleted (`DELETE /v1/sessions/:id`, or its parent's deletion): final, nothing
    /// replaces it (decision 0017).
    Disposed,
}

impl ChildLifecycle {
    /// The wire name of the state.
    pub fn name(&self) -> &'static str {
        match self {
            ChildLifecycle::Spawning => "spawning",
            ChildLifecycle::Queued { .. } => "queued",
            ChildLifecycle::Created => "created",
            ChildLifecycle::Running => "running",
            ChildLifecycle::Idle { .. } => "idle",
            ChildLifecycle::Failed { .. } => "failed",
            ChildLifecycle::Stopped => "stopped",
            ChildLifecycle::Disposed => "disposed",
        }
    }

    /// Whether the child has nothing left to do until someone sends it input.
    pub fn is_settled(&self) -> bool {
        matches!(
            self,
            ChildLifecycle::Idle { .. }
                | ChildLifecycle::Failed { .. }
                | ChildLifecycle::Stopped
                | ChildLifecycle::Disposed
        )
    }

    /// Whether the child holds or waits for a slot of the gate (so a cascade stops it).
    pub fn is_active(&self) -> bool {
        !self.is_settled()
    }
}

/// One child as its parent knows it; also the `child_status` follow event and the body a child
/// reports with (`POST /child_event` between actors).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChildStatus {
    /// The child's session id.
    pub id: String,
    /// Its title, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Spawned `detached`: a stopped parent does not stop it.
    #[serde(default)]
    pub detached: bool,
    /// Where it is.
    #[serde(flatten)]
    pub lifecycle: ChildLifecycle,
    /// The child's newest cursor when this happened: reports are sent concurrently and may
    /// arrive out of order; the newer one wins.
    pub cursor: u64,
    /// What the child and its own children spent when it reported (tokens, dollars): counted
    /// against its parent's budget too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<super::Spent>,
    /// The branch the child's own worktree was on, once the worktree was removed at the
    /// child's end (the branch is kept; `keepWorktree` keeps the worktree too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// The commit that branch was at when the worktree was removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
}
