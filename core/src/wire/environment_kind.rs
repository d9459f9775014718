//! The kinds of environment: a leaf of `wire`, so the cell rules (`crate::cell`), which
//! `wire::runner` uses for a definition's cell settings, can name a kind without a circle.

use serde::{Deserialize, Serialize};

/// The kinds of environment.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum EnvironmentKind {
    /// An existing directory, used in place.
    Local,
    /// A template directory copied per session.
    FolderTemplate,
    /// A git worktree on a new branch per session.
    Worktree,
}

impl EnvironmentKind {
    /// The wire name (`local`, `folder-template`, `worktree`).
    pub fn as_str(self) -> &'static str {
        match self {
            EnvironmentKind::Local => "local",
            EnvironmentKind::FolderTemplate => "folder-template",
            EnvironmentKind::Worktree => "worktree",
        }
    }
}
