//! Child sessions (issue 12, `docs/orchestration.md`): the rules of a session tree.
//!
//! A session may spawn children. The core keeps the invariants that are its own and publishes
//! what happens; it enforces no policy beyond them (seed 002):
//!
//! * **Lineage.** A child knows its parent and its depth (a root is at depth 0); the chain of
//!   ancestors is kept so a request that would close a loop is refused ([`child_lineage`],
//!   [`check_target`]).
//! * **Recursion guard.** A session at the maximum depth is not offered the spawn tools, and a
//!   spawn from it is refused ([`may_spawn`]).
//! * **Lifecycle.** A child's drains become lifecycle reports ([`turn_outcome`]); the parent
//!   keeps the newest ([`accept_report`]) and learns of the ones that matter to it as
//!   `custom_message` entries on its `system` lane ([`parent_message`]).
//! * **Concurrency gate.** At most [`Limits::max_children`] running children per parent and
//!   [`Limits::max_running`] running spawned sessions per tenant; spawns beyond wait in order
//!   ([`Gate`]). Its host reconciles it on a timer ([`Gate::reconcile`]): a slot whose child
//!   settled or is gone is free again within [`LOST_RELEASE_BOUND_MS`] even when its release was
//!   lost.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::session::{Effect, SystemInput};
use crate::wire::{
    ChildLifecycle, ChildStatus, ContentBlock, EntryPayload, Message, Spent, Status, custom_types,
};

/// Depth at which a session no longer gets the spawn tools, unless configured.
pub const DEFAULT_MAX_DEPTH: u32 = 2;
/// Running children per parent, unless configured (`WUHU_MAX_CHILDREN`).
pub const DEFAULT_MAX_CHILDREN: u32 = 4;
/// Running spawned sessions per tenant, unless configured (`WUHU_MAX_RUNNING_SESSIONS`).
pub const DEFAULT_MAX_RUNNING_SESSIONS: u32 = 32;
/// How many spawns may wait at a tenant's gate; a spawn beyond is refused.
pub const MAX_WAITING: usize = 1000;
/// How many children one session may spawn in its life (its `children` rows are bounded).
pub const MAX_CHILDREN_PER_SESSION: usize = 256;
/// How much of a child's final text its parent's `system` message quotes.
pub const MAX_FINAL_TEXT_BYTES: usize = 16 * 1024;
/// How often the tenant index reconciles its gate while any slot is held or waited for.
pub const RECONCILE_EVERY_MS: u64 = 20_000;
/// A slot granted (or granted again) more recently than this is not reconciled: its child may
/// not have started its turn yet.
pub const RECONCILE_GRACE_MS: u64 = 20_000;
/// The bound on a lost release: a slot whose child settled is free again this long after it
/// settled, at the latest (the grace, then at most one period of reconciliation, plus the time
/// the pass takes to ask its holders).
pub const LOST_RELEASE_BOUND_MS: u64 = 60_000;

/// The configured limits of a deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Depth from which a session may not spawn (`WUHU_MAX_SESSION_DEPTH`).
    pub max_depth: u32,
    /// Running children per parent (`WUHU_MAX_CHILDREN`).
    pub max_children: u32,
    /// Running spawned sessions per tenant (`WUHU_MAX_RUNNING_SESSIONS`).
    pub max_running: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: DEFAULT_MAX_DEPTH,
            max_children: DEFAULT_MAX_CHILDREN,
            max_running: DEFAULT_MAX_RUNNING_SESSIONS,
        }
    }
}

impl Limits {
    /// Reads the limits from configuration variables; a missing, unparsable or zero value keeps
    /// the default (a limit of zero would make every spawn wait forever).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Limits {
        let read = |name: &str, default: u32| {
            var(name)
                .and_then(|v| v.trim().parse::<u32>().ok())
                .filter(|&v| v > 0)
                .unwrap_or(default)
        };
        Limits {
            max_depth: read("WUHU_MAX_SESSION_DEPTH", DEFAULT_MAX_DEPTH),
            max_children: read("WUHU_MAX_CHILDREN", DEFAULT_MAX_CHILDREN),
            max_running: read("WUHU_MAX_RUNNING_SESSIONS", DEFAULT_MAX_RUNNING_SESSIONS),
        }
    }
}

/// Where a session sits in its tree. Persisted with the session; a root has the default.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Lineage {
    /// The parent session, for a child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// 0 for a root, the parent's depth + 1 for a child.
    #[serde(default)]
    pub depth: u32,
    /// Every ancestor, the root first (the parent last). At most `max_depth` long.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ancestors: Vec<String>,
    /// Spawned `detached`: its parent's stop does not stop it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub detached: bool,
    /// A budget of an ancestor set a USD limit when this session was spawned. Its spending
    /// counts against its ancestors' budgets, so its models need prices as theirs do
    /// (`crate::llm::choice::UsdLimits::ancestor`). A child keeps its parent's and adds the
    /// parent's own budget (the host sets it when spawning).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub usd_budget_above: bool,
}

/// Why a spawn is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpawnRefused {
    /// The recursion guard: the session is at the maximum depth.
    #[error(
        "this session is at depth {depth}, the maximum for spawning is {max}: a child at the maximum depth may not spawn"
    )]
    AtMaxDepth {
        /// The session's depth.
        depth: u32,
        /// The configured maximum.
        max: u32,
    },
    /// The new session would be its own ancestor.
    #[error("spawning {id} would form a cycle in the session tree")]
    Cycle {
        /// The id that closes the loop.
        id: String,
    },
    /// The session spawned [`MAX_CHILDREN_PER_SESSION`] children already.
    #[error("this session already spawned {MAX_CHILDREN_PER_SESSION} children")]
    TooManyChildren,
}

/// Why a session may not act on another (`send_to_session`, `wait_sessions`, `stop_session`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetRefused {
    /// The target is the caller itself or one of its ancestors: waiting on it would deadlock
    /// (it may be waiting on the caller), steering it would loop.
    #[error("session {id} is this session or one of its ancestors: that would form a cycle")]
    Cycle {
        /// The target.
        id: String,
    },
    /// Only a session's own children are steered, awaited and stopped from it.
    #[error("session {id} is not a child of this session")]
    NotAChild {
        /// The target.
        id: String,
    },
}

/// Whether a session at `depth` is offered the spawn tools (the recursion guard).
pub fn may_spawn(depth: u32, limits: &Limits) -> bool {
    depth < limits.max_depth
}

/// The lineage of a child `child_id` spawned by `parent_id` (whose lineage is `parent`), which
/// has spawned `spawned` children so far.
///
/// # Errors
/// [`SpawnRefused`] at the maximum depth, when the child would be an ancestor of itself (a
/// reused id, or a corrupt lineage), or after [`MAX_CHILDREN_PER_SESSION`] children.
pub fn child_lineage(
    parent_id: &str,
    parent: &Lineage,
    child_id: &str,
    spawned: usize,
    detached: bool,
    limits: &Limits,
) -> Result<Lineage, SpawnRefused> {
    if !may_spawn(parent.depth, limits) {
        return Err(SpawnRefused::AtMaxDepth {
            depth: parent.depth,
            max: limits.max_depth,
        });
    }
    if child_id == parent_id
        || parent.ancestors.iter().any(|a| a == child_id)
        || parent.ancestors.iter().any(|a| a == parent_id)
    {
        return Err(SpawnRefused::Cycle {
            id: child_id.to_string(),
        });
    }
    if spawned >= MAX_CHILDREN_PER_SESSION {
        return Err(SpawnRefused::TooManyChildren);
    }
    let mut ancestors = parent.ancestors.clone();
    ancestors.push(parent_id.to_string());
    Ok(Lineage {
        parent_id: Some(parent_id.to_string()),
        depth: parent.depth + 1,
        ancestors,
        detached,
        usd_budget_above: parent.usd_budget_above,
    })
}

/// Whether `caller_id` (with lineage `caller`) may steer, await or stop `target`; `is_child`
/// says whether `target` is one of its recorded children.
///
/// # Errors
/// [`TargetRefused`] for itself, an ancestor, or a session that is not its child.
pub fn check_target(
    caller_id: &str,
    caller: &Lineage,
    target: &str,
    is_child: bool,
) -> Result<(), TargetRefused> {
    if target == caller_id || caller.ancestors.iter().any(|a| a == target) {
        return Err(TargetRefused::Cycle {
            id: target.to_string(),
        });
    }
    if !is_child {
        return Err(TargetRefused::NotAChild {
            id: target.to_string(),
        });
    }
    Ok(())
}

/// What a child's committed drain means to its parent: the turn started (`running`), ended
/// (`idle` with the final assistant text, or `failed` when the LLM gave up), or the child was
/// stopped. `None` when the drain changed none of that.
pub fn turn_outcome(effects: &[Effect]) -> Option<ChildLifecycle> {
    let status = effects.iter().rev().find_map(|e| match e {
        Effect::StatusChanged(s) => Some(*s),
        _ => None,
    })?;
    match status {
        Status::Running => Some(ChildLifecycle::Running),
        Status::Stopped => Some(ChildLifecycle::Stopped),
        Status::Idle => {
            // The turn ends after its last entry: an assistant message without tool calls, or
            // an LLM error that will not be retried.
            let last = effects.iter().rev().find_map(|e| match e {
                Effect::AppendEntry(entry) => match &entry.payload {
                    EntryPayload::Message {
                        message: Message::Assistant(a),
                    } => Some(Ok(a)),
                    EntryPayload::Custom { custom_type, data }
                        if custom_type == custom_types::LLM_ERROR =>
                    {
                        Some(Err(data))
                    }
                    _ => None,
                },
                _ => None,
            });
            match last {
                Some(Err(data)) => Some(ChildLifecycle::Failed {
                    message: data
                        .get("message")
                        .and_then(|m| m.as_str())
                        .unwrap_or("the LLM request failed")
                        .to_string(),
                }),
                Some(Ok(assistant)) => {
                    let text: String = assistant
                        .content
                        .iter()
                        .filter_map(|b| match b {
                            ContentBlock::Text { text } => Some(text.as_str()),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                        .join("");
                    Some(ChildLifecycle::Idle {
                        final_text: (!text.trim().is_empty()).then(|| cut_text(&text)),
                    })
                }
                None => Some(ChildLifecycle::Idle { final_text: None }),
            }
        }
    }
}

fn cut_text(text: &str) -> String {
    if text.len() <= MAX_FINAL_TEXT_BYTES {
        return text.to_string();
    }
    let mut end = MAX_FINAL_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[cut at {MAX_FINAL_TEXT_BYTES} bytes: read_session shows the rest]",
        &text[..end]
    )
}

/// One lifespan for a child and its worktree (seed 002): whether the worktree made for a child
/// (`spawn_session {environment}`, at its slot) is removed, its branch kept, when the child
/// reaches `lifecycle`. Removed when the child ends (`idle` after its task, `failed`,
/// `stopped`; `disposed` removes it with the session's other worktrees, decision 0017) unless
/// its definition keeps it (`keepWorktree`); never while it may still run, and never an
/// environment of another kind (a `local` directory is the machine's own, a `folder-template`
/// copy is discarded with the session).
pub fn removes_worktree_at(
    lifecycle: &ChildLifecycle,
    kind: crate::wire::runner::EnvironmentKind,
    keep_worktree: bool,
) -> bool {
    kind == crate::wire::runner::EnvironmentKind::Worktree
        && !keep_worktree
        && lifecycle.is_settled()
}

/// Where a state sits in a turn, to order reports that share a cursor.
pub fn lifecycle_rank(lifecycle: &ChildLifecycle) -> u8 {
    match lifecycle {
        ChildLifecycle::Spawning => 0,
        ChildLifecycle::Queued { .. } => 1,
        ChildLifecycle::Created => 2,
        ChildLifecycle::Running => 3,
        ChildLifecycle::Idle { .. } | ChildLifecycle::Failed { .. } | ChildLifecycle::Stopped => 4,
        ChildLifecycle::Disposed => 5,
    }
}

/// Whether a parent that recorded `known` about a child takes `report`: reports travel
/// concurrently, so only a newer one (a higher cursor, or the same cursor and a later state)
/// replaces what is known; a repeat or an older one is dropped. `disposed` is final: it replaces
/// anything and nothing replaces it (a report sent before the deletion may arrive after it).
pub fn accept_report(known: Option<&ChildStatus>, report: &ChildStatus) -> bool {
    match known {
        None => true,
        Some(known) if known.lifecycle == ChildLifecycle::Disposed => false,
        Some(_) if report.lifecycle == ChildLifecycle::Disposed => true,
        Some(known) => {
            (report.cursor, lifecycle_rank(&report.lifecycle))
                > (known.cursor, lifecycle_rank(&known.lifecycle))
        }
    }
}

/// What a session's children spent, as they last reported (each child's report counts its own
/// children): what the session's budget counts besides its own requests.
pub fn children_spent(children: &[ChildStatus]) -> Spent {
    children
        .iter()
        .filter_map(|c| c.spent.as_ref())
        .fold(Spent::default(), |total, spent| total.plus(spent))
}

/// A message for the parent's `system` lane.
#[derive(Clone, Debug, PartialEq)]
pub struct ParentMessage {
    /// Queue item id: the same report always gets the same id, so a repeat is not queued twice.
    pub id: String,
    /// The text the parent's LLM sees.
    pub content: String,
    /// Its `custom_message` type and details.
    pub input: SystemInput,
}

/// The `custom_message` a parent gets for a child's report, for the states that matter to it:
/// `idle` (with the final text), `failed`, `stopped` and `disposed`. The others only reach
/// followers.
pub fn parent_message(status: &ChildStatus) -> Option<ParentMessage> {
    let name = match &status.title {
        Some(title) => format!("Child session {} ({title:?})", status.id),
        None => format!("Child session {}", status.id),
    };
    let content = match &status.lifecycle {
        ChildLifecycle::Idle {
            final_text: Some(text),
        } => format!("{name} finished its turn and is idle. Its final message:\n\n{text}"),
        ChildLifecycle::Idle { final_text: None } => {
            format!("{name} finished its turn and is idle. It gave no final text.")
        }
        ChildLifecycle::Failed { message } => format!("{name} failed: {message}"),
        ChildLifecycle::Stopped => format!("{name} was stopped."),
        ChildLifecycle::Disposed => format!("{name} was deleted: it is gone with its transcript."),
        _ => return None,
    };
    Some(ParentMessage {
        id: format!(
            "child-{}-{}-{}",
            status.id,
            status.lifecycle.name(),
            status.cursor
        ),
        content,
        input: SystemInput {
            custom_type: custom_types::CHILD_STATUS.into(),
            details: serde_json::to_value(status).ok(),
        },
    })
}

/// One spawned session holding or waiting for a slot.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Slot {
    /// The child.
    pub child: String,
    /// Its parent.
    pub parent: String,
}

/// What the gate answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The child may run now.
    Granted,
    /// The child waits; it is granted when slots free, in order.
    Queued {
        /// 1-based place among the waiting spawns of the tenant.
        position: u32,
        /// Which limit is reached, in words.
        reason: String,
    },
}

/// Why the gate refused to queue a spawn.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{MAX_WAITING} spawns already wait for a slot in this workspace")]
pub struct GateFull;

/// One tenant's concurrency gate: slots held by running children and spawns waiting in order.
/// Persisted whole by its host after every change (bounded by the limits and [`MAX_WAITING`]),
/// so it survives restarts.
///
/// Invariant after every call: no waiting spawn fits, so a new spawn that fits overtakes no one
/// that could run.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Gate {
    running: Vec<Slot>,
    waiting: VecDeque<Slot>,
    /// When each running child was last granted its slot (unix ms; absent in gates saved before
    /// it was kept, which read as granted long ago).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    granted_at: BTreeMap<String, u64>,
}

/// What the tenant index learnt of a slot's child when it reconciled the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// It runs a turn, or keeps input for one: it needs its slot.
    Running,
    /// It is idle, failed or stopped: it no longer needs its slot.
    Settled,
    /// It was deleted (or never existed).
    Gone,
    /// It could not be asked: nothing is decided.
    Unknown,
}

/// What a reconciliation changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Children whose slot (or place in line) was freed.
    pub freed: Vec<String>,
    /// Spawns granted in their stead (their hosts start them).
    pub granted: Vec<Slot>,
}

impl Gate {
    /// Asks for a slot for `slot.child` at `now`. Asking again is harmless: a running child is
    /// granted again (which renews its grant), a waiting one is told its place.
    ///
    /// # Errors
    /// [`GateFull`] when [`MAX_WAITING`] spawns wait already.
    pub fn request(
        &mut self,
        slot: Slot,
        limits: &Limits,
        now: u64,
    ) -> Result<Admission, GateFull> {
        if self.running.iter().any(|s| s.child == slot.child) {
            self.granted_at.insert(slot.child, now);
            return Ok(Admission::Granted);
        }
        if let Some(i) = self.waiting.iter().position(|s| s.child == slot.child) {
            return Ok(self.queued(i, limits));
        }
        if self.blocked(&slot.parent, limits).is_none() {
            self.granted_at.insert(slot.child.clone(), now);
            self.running.push(slot);
            return Ok(Admission::Granted);
        }
        if self.waiting.len() >= MAX_WAITING {
            return Err(GateFull);
        }
        self.waiting.push_back(slot);
        Ok(self.queued(self.waiting.len() - 1, limits))
    }

    /// Frees the slot of `child` (or takes it out of the waiting line) and grants waiting
    /// spawns that now fit, in order. Returns the newly granted ones: their hosts start them.
    ///
    /// With `granted_before`, a slot granted (or granted again) at or after that time is kept:
    /// the release is late, and the child was given its slot again for new input.
    pub fn release(
        &mut self,
        child: &str,
        granted_before: Option<u64>,
        limits: &Limits,
        now: u64,
    ) -> Vec<Slot> {
        let granted = self.granted_at.get(child).copied().unwrap_or(0);
        if granted_before.is_none_or(|before| granted < before) {
            self.running.retain(|s| s.child != child);
            self.granted_at.remove(child);
        }
        self.waiting.retain(|s| s.child != child);
        self.admit(limits, now)
    }

    /// Grants waiting spawns that fit, in order (after a release, or when limits grew).
    pub fn admit(&mut self, limits: &Limits, now: u64) -> Vec<Slot> {
        let mut granted = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            if self.blocked(&self.waiting[i].parent, limits).is_none() {
                let slot = self.waiting.remove(i).expect("index checked");
                self.granted_at.insert(slot.child.clone(), now);
                self.running.push(slot.clone());
                granted.push(slot);
            } else {
                i += 1;
            }
        }
        granted
    }

    /// Whether nothing holds or waits for a slot (no reconciliation is needed).
    pub fn is_empty(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// The children a reconciliation at `now` asks about: each running one granted at least
    /// [`RECONCILE_GRACE_MS`] ago. (A waiting child is not asked: one that lives asks the gate
    /// again by itself; its host tells [`Gate::reconcile`] of those deleted.)
    pub fn to_reconcile(&self, now: u64) -> Vec<String> {
        self.running
            .iter()
            .filter(|s| self.granted_long_ago(&s.child, now))
            .map(|s| s.child.clone())
            .collect()
    }

    /// Applies what a reconciliation learnt at `now` (`holders`: each child asked about, with
    /// what was found), against the gate as it is now: a running slot whose child is settled or
    /// gone, and was granted at least the grace ago (a grant renewed while the pass asked is
    /// kept), is freed; a waiting child that is gone leaves the line; then the waiting spawns
    /// that fit are granted. `Running` and `Unknown` keep everything.
    pub fn reconcile(
        &mut self,
        holders: &[(String, Holder)],
        limits: &Limits,
        now: u64,
    ) -> Reconciled {
        let mut freed = Vec::new();
        for (child, holder) in holders {
            let free = match holder {
                Holder::Running | Holder::Unknown => false,
                Holder::Settled => self.granted_long_ago(child, now),
                Holder::Gone => {
                    self.granted_long_ago(child, now)
                        || self.waiting.iter().any(|s| &s.child == child)
                }
            };
            let present = self
                .running
                .iter()
                .chain(self.waiting.iter())
                .any(|s| &s.child == child);
            if free && present {
                self.running.retain(|s| &s.child != child);
                self.waiting.retain(|s| &s.child != child);
                self.granted_at.remove(child);
                freed.push(child.clone());
            }
        }
        let granted = self.admit(limits, now);
        Reconciled { freed, granted }
    }

    fn granted_long_ago(&self, child: &str, now: u64) -> bool {
        self.running.iter().any(|s| s.child == child)
            && self
                .granted_at
                .get(child)
                .is_none_or(|&at| now.saturating_sub(at) >= RECONCILE_GRACE_MS)
    }

    /// Spawns holding a slot.
    pub fn running(&self) -> &[Slot] {
        &self.running
    }

    /// Spawns waiting, first in line first.
    pub fn waiting(&self) -> impl Iterator<Item = &Slot> {
        self.waiting.iter()
    }

    fn queued(&self, index: usize, limits: &Limits) -> Admission {
        let parent = &self.waiting[index].parent;
        Admission::Queued {
            position: index as u32 + 1,
            reason: self
                .blocked(parent, limits)
                .unwrap_or_else(|| "earlier spawns wait".into()),
        }
    }

    /// Which limit keeps a child of `parent` from running now, if any.
    fn blocked(&self, parent: &str, limits: &Limits) -> Option<String> {
        let total = self.running.len() as u32;
        if total >= limits.max_running {
            return Some(format!(
                "{total} spawned sessions run in this workspace (limit {}, WUHU_MAX_RUNNING_SESSIONS)",
                limits.max_running
            ));
        }
        let siblings = self.running.iter().filter(|s| s.parent == parent).count() as u32;
        if siblings >= limits.max_children {
            return Some(format!(
                "{siblings} children of this session run (limit {}, WUHU_MAX_CHILDREN)",
                limits.max_children
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests;
