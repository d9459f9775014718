//! Wire contracts: every type that crosses a process boundary (HTTP bodies, SSE events,
//! persisted transcript entries). **API Boundary**: changing a type here changes the protocol.

mod api;
mod children;
mod entry;
pub mod environment_kind;
mod environments;
pub mod runner;
mod stream;
mod tokens;
mod workspace;

pub use api::*;
pub use children::*;
pub use entry::*;
pub use environments::*;
pub use stream::*;
pub use tokens::*;
pub use workspace::*;

use serde::{Deserialize, Serialize};

/// Input lanes of a session.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub enum Lane {
    /// Delivered at the next step boundary; skips the remaining tool calls of that step.
    Steer,
    /// Delivered only when the agent would otherwise stop.
    FollowUp,
    /// Internal notifications; delivered like steer, never cancellable.
    System,
}

impl Lane {
    /// Parses the `lane` query parameter; `system` is internal and refused.
    pub fn parse_public(s: &str) -> Option<Lane> {
        match s {
            "steer" => Some(Lane::Steer),
            "followUp" => Some(Lane::FollowUp),
            _ => None,
        }
    }
}

/// Execution status of a session.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Nothing to do.
    #[default]
    Idle,
    /// A turn is in progress.
    Running,
    /// Stopped by a person; the next enqueue resumes.
    Stopped,
}

impl Status {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Idle => "idle",
            Status::Running => "running",
            Status::Stopped => "stopped",
        }
    }
}
