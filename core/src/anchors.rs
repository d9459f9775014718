//! Which older entries a session's context needs besides its newest ones (the *anchors*): the
//! pinned messages (the global context, each attached environment's AGENTS.md) and the latest
//! compaction with the user messages it carries. Kept in the checkpoint, so a host that loads
//! only its newest entries knows which others to read ([`crate::context::ContextWindow`]);
//! [`crate::compaction`] builds requests and plans compactions from them.

use serde::{Deserialize, Serialize};

use crate::wire::{Compaction, Entry, EntryPayload, Message, custom_types};

/// Most pinned messages remembered (global context plus one AGENTS.md per environment).
pub const MAX_PINNED: usize = 32;

/// Which older entries the context needs besides the newest ones: kept in the checkpoint, so
/// a host that loads only its newest entries knows which others to read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Anchors {
    /// Pinned messages, oldest first (at most [`MAX_PINNED`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<Pinned>,
    /// The latest compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionAnchor>,
}

/// A pinned message: the global context, or an environment's AGENTS.md.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Pinned {
    /// Its entry.
    pub cursor: u64,
    /// The environment whose AGENTS.md it is (`None`: the global context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
}

/// Where the latest compaction is.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CompactionAnchor {
    /// The `compaction` entry.
    pub cursor: u64,
    /// Its `first_kept_cursor`.
    pub first_kept_cursor: u64,
    /// Its `kept_cursors` (the user messages it carries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<u64>,
}

/// How an entry changes the anchors.
enum AnchorChange<'a> {
    Pin(Option<&'a str>),
    Unpin(&'a str),
    Compaction(&'a Compaction),
}

fn anchor_change(entry: &Entry) -> Option<AnchorChange<'_>> {
    match &entry.payload {
        EntryPayload::Message {
            message: Message::CustomMessage { custom_type, .. },
        } if custom_type == custom_types::GLOBAL_CONTEXT => Some(AnchorChange::Pin(None)),
        EntryPayload::Message {
            message:
                Message::CustomMessage {
                    custom_type,
                    details,
                    ..
                },
        } if custom_type == custom_types::AGENTS_MD => Some(AnchorChange::Pin(Some(
            details
                .as_ref()
                .and_then(|d| d.get("environment"))
                .and_then(|e| e.as_str())
                .unwrap_or(""),
        ))),
        EntryPayload::Custom { custom_type, data }
            if custom_type == custom_types::ENVIRONMENT_DETACHED =>
        {
            data.get("environment")
                .and_then(|e| e.as_str())
                .map(AnchorChange::Unpin)
        }
        EntryPayload::Compaction(compaction) => Some(AnchorChange::Compaction(compaction)),
        _ => None,
    }
}

impl Anchors {
    /// Notes an appended entry. Returns the cursors no longer anchored (a replaced AGENTS.md,
    /// a detached environment's, the previous compaction, the oldest pin beyond the bound).
    pub fn observe(&mut self, entry: &Entry) -> Vec<u64> {
        let mut dropped = Vec::new();
        match anchor_change(entry) {
            None => {}
            Some(AnchorChange::Pin(environment)) => {
                let environment = environment.map(str::to_string);
                self.pinned.retain(|p| {
                    let keep = p.environment != environment;
                    if !keep {
                        dropped.push(p.cursor);
                    }
                    keep
                });
                self.pinned.push(Pinned {
                    cursor: entry.cursor,
                    environment,
                });
                if self.pinned.len() > MAX_PINNED {
                    dropped.push(self.pinned.remove(0).cursor);
                }
            }
            Some(AnchorChange::Unpin(name)) => self.pinned.retain(|p| {
                let keep = p.environment.as_deref() != Some(name);
                if !keep {
                    dropped.push(p.cursor);
                }
                keep
            }),
            Some(AnchorChange::Compaction(compaction)) => {
                if let Some(previous) = self.compaction.take() {
                    dropped.push(previous.cursor);
                    dropped.extend(
                        previous
                            .kept
                            .into_iter()
                            .filter(|c| !compaction.kept_cursors.contains(c)),
                    );
                }
                self.compaction = Some(CompactionAnchor {
                    cursor: entry.cursor,
                    first_kept_cursor: compaction.first_kept_cursor,
                    kept: compaction.kept_cursors.clone(),
                });
            }
        }
        dropped
    }

    /// Every anchored cursor, ascending.
    pub fn cursors(&self) -> Vec<u64> {
        let mut cursors: Vec<u64> = self.pinned.iter().map(|p| p.cursor).collect();
        if let Some(compaction) = &self.compaction {
            cursors.push(compaction.cursor);
            cursors.extend(&compaction.kept);
        }
        cursors.sort_unstable();
        cursors
    }

    /// Whether a compaction that keeps entries from `first_kept_cursor` on moves the context
    /// forward (it must keep less than the latest one did).
    pub fn accepts(&self, first_kept_cursor: u64) -> bool {
        self.compaction
            .as_ref()
            .is_none_or(|c| first_kept_cursor > c.first_kept_cursor)
    }
}
