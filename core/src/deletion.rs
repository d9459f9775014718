//! Deleting a session (`DELETE /v1/sessions/:id`, decisions 0017 and 0033): what goes with it
//! (its children and its forks), the order of the steps and where they stand, so a deletion
//! that was acknowledged finishes after a restart.
//!
//! Who may delete is [`crate::authority::session_allows`] with
//! [`crate::authority::SessionAction::Delete`]: the session's owner or an admin.
//!
//! A deletion starts by storing a [`Deletion`] in the session actor's own storage (the *mark*):
//! from then on the session answers as if it did not exist, and the actor performs the
//! [`Step`]s in order, recording each one done. A step is idempotent (deleting what is already
//! gone does nothing), so repeating the step that was running when the isolate died is safe.
//! The last step drops the actor's storage, the mark with it.

use std::collections::{BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::authority::Access;
use crate::environments::Attachment;
use crate::wire::Spent;
use crate::wire::runner::{DiscardOutcome, EnvironmentKind, WorkspaceHost};

/// One step of a deletion, in the order they run ([`STEPS`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// End the running turn: abort its inference and tool tasks, cancel its runner calls,
    /// withdraw waiting approvals, kill its background jobs, drop input waiting for a slot.
    /// Nothing is written to the transcript: it is about to go.
    Stop,
    /// Remove it from the tenant's session list (the index keeps a tombstone, so a late
    /// refresh of the row does not bring it back).
    Unlist,
    /// Delete every child it spawned and every fork of it (whoever made the fork: a fork reads
    /// its history from this session, decision 0033), each with its own deletion (which takes
    /// its own children and forks), and wait.
    DisposeChildren,
    /// Tell its parent, if it is a child, that it is `disposed`, and free its gate slot.
    TellParent,
    /// Delete its objects: archive segments, out-of-line entries, blobs, request logs
    /// ([`object_prefixes`]).
    DeleteObjects,
    /// Hand the runners it attached a `folder-template` or `worktree` environment on
    /// ([`WorkspaceHost`]s) to the tenant's runner hub, which tells each to discard the
    /// session's stored workspaces, local copies and git worktrees (their branches kept), now
    /// or when it next connects. Before
    /// [`Step::DropStorage`], which drops the list. Added after the others: a mark stored by an
    /// older version with every step before [`Step::DropStorage`] done runs this one next.
    DiscardWorkspaces,
    /// Drop the actor's storage (SQLite and alarm), the mark with it. Always last.
    DropStorage,
}

/// Every step, in order.
pub const STEPS: [Step; 7] = [
    Step::Stop,
    Step::Unlist,
    Step::DisposeChildren,
    Step::TellParent,
    Step::DeleteObjects,
    Step::DiscardWorkspaces,
    Step::DropStorage,
];

/// A deletion in progress: what the session was (enough to authorise a repeated `DELETE` and to
/// perform the steps without loading it) and how many steps are done.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Deletion {
    /// The session.
    pub session_id: String,
    /// Its tenant.
    pub tenant: String,
    /// Its owner when it was marked.
    pub owner: String,
    /// Its creator.
    pub created_by: String,
    /// Its access when it was marked.
    pub access: Access,
    /// Its parent, for a child.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
    /// Whether it was spawned detached (told to the parent with `disposed`).
    #[serde(default)]
    pub detached: bool,
    /// Its title (told to the parent with `disposed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Its newest committed cursor when it was marked.
    pub cursor: u64,
    /// What it and its children spent (told to the parent with `disposed`: the parent's budget
    /// keeps counting it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Spent>,
    /// Who asked (a person's `sub`, or `wuhu` when its parent's deletion disposed of it).
    pub requested_by: String,
    /// How many of [`STEPS`] are done.
    pub steps_done: usize,
}

impl Deletion {
    /// The step to perform now; `None` once every step is done.
    #[must_use]
    pub fn next_step(&self) -> Option<Step> {
        STEPS.get(self.steps_done).copied()
    }

    /// Records that `step` is done. A step reported out of order (a repeat after a restart, or
    /// a step not yet due) changes nothing.
    pub fn handle_step_done(&mut self, step: Step) {
        if self.next_step() == Some(step) {
            self.steps_done += 1;
        }
    }

    /// Whether every step is done.
    pub fn is_done(&self) -> bool {
        self.next_step().is_none()
    }
}

/// One session of a tenant's list, as the forks rule sees it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TreeRow {
    /// The session.
    pub id: String,
    /// Its parent, for a child.
    pub parent_id: Option<String>,
    /// The session whose history it reads, for a fork.
    pub forked_from: Option<String>,
}

/// The forks that go with `target`'s deletion (decision 0033): every listed session that reads
/// its history from `target` (a fork, by anyone), sorted. Forks of its descendants go with the
/// descendants' own deletions, and forks of forks with their forks'.
pub fn forks_of(target: &str, rows: &[TreeRow]) -> Vec<String> {
    let mut forks: Vec<String> = rows
        .iter()
        .filter(|row| row.id != target && row.forked_from.as_deref() == Some(target))
        .map(|row| row.id.clone())
        .collect();
    forks.sort();
    forks.dedup();
    forks
}

/// `target` and every session whose chain of parents reaches it (cycle-safe).
pub fn subtree<'a>(target: &'a str, rows: &'a [TreeRow]) -> BTreeSet<&'a str> {
    let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
    for row in rows {
        if let Some(parent) = row.parent_id.as_deref() {
            children.entry(parent).or_default().push(row.id.as_str());
        }
    }
    let mut seen = BTreeSet::from([target]);
    let mut queue = VecDeque::from([target]);
    while let Some(id) = queue.pop_front() {
        for &child in children.get(id).into_iter().flatten() {
            if seen.insert(child) {
                queue.push_back(child);
            }
        }
    }
    seen
}

/// The object-storage prefixes holding a session's objects: its archive segments
/// ([`crate::archive::segment_prefix`]), its out-of-line entries
/// ([`crate::out_of_line::blob_prefix`]), its blobs ([`crate::blobs::session_prefix`]) and its
/// request logs ([`crate::llm::request_log::session_prefix`]). Nothing else in the bucket is
/// keyed by session.
pub fn object_prefixes(tenant: &str, session_id: &str) -> [String; 4] {
    [
        crate::archive::segment_prefix(tenant, session_id),
        crate::out_of_line::blob_prefix(tenant, session_id),
        crate::blobs::session_prefix(tenant, session_id),
        crate::llm::request_log::session_prefix(tenant, session_id),
    ]
}

/// Whether `id` has the shape of a session id (a UUID: 36 hex digits and dashes). A discard
/// names nothing else, so its key prefix (`workspaces/<id>/`) and its local directories
/// (`<id>`, `<id>-N`) can never reach another session's.
pub fn is_session_id(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Most runners a session records as hosts of its workspaces (one per runner it attached a
/// `folder-template` environment on); a further one is not recorded (logged), and its copy of
/// the workspace is not discarded with the session.
pub const MAX_WORKSPACE_HOSTS: usize = 16;

/// What recording an attachment's runner did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostRecord {
    /// A new host: store the list.
    Added,
    /// Already recorded, or not a `folder-template` environment: nothing to store.
    Unchanged,
    /// [`MAX_WORKSPACE_HOSTS`] are recorded already: not recorded.
    Full,
}

/// Records the runner of a new attachment as a host of the session's workspaces when the
/// environment is one a runner makes per session: a `folder-template` copy (and its stored
/// workspace) or a git `worktree` (removed with the session, its branch kept, even when the
/// session never detached it). `local` directories are the machine's own: never recorded.
/// The runner and its owner are the hub's answer to the session's own attach, never what a
/// runner said.
pub fn record_workspace_host(
    hosts: &mut Vec<WorkspaceHost>,
    attachment: &Attachment,
) -> HostRecord {
    if !matches!(
        attachment.environment.kind,
        EnvironmentKind::FolderTemplate | EnvironmentKind::Worktree
    ) {
        return HostRecord::Unchanged;
    }
    let host = WorkspaceHost {
        owner: attachment.runner_owner.clone(),
        runner: attachment.runner.clone(),
    };
    if hosts.contains(&host) {
        return HostRecord::Unchanged;
    }
    if hosts.len() >= MAX_WORKSPACE_HOSTS {
        return HostRecord::Full;
    }
    hosts.push(host);
    HostRecord::Added
}

/// Most discards a runner hub keeps waiting for their runners (per tenant). Past it the oldest
/// are dropped (logged: those workspaces stay in their runners' stores).
pub const MAX_PENDING_DISCARDS: usize = 10_000;
/// Most discards sent to one runner connection and not answered yet; the next goes when one is
/// answered.
pub const DISCARDS_IN_FLIGHT: usize = 8;

/// Which hosts of a `/discard` request the hub keeps a pending discard for: those that are
/// runners of the tenant it knows (a freed or expired runner name is no runner; a new runner
/// taking the name later is a different machine), each once, at most [`MAX_WORKSPACE_HOSTS`].
/// Returns `(kept, unknown)`. `known` holds `(owner, name)` of the hub's runner rows.
pub fn discard_targets<'a>(
    hosts: &'a [WorkspaceHost],
    known: &[(&str, &str)],
) -> (Vec<&'a WorkspaceHost>, Vec<&'a WorkspaceHost>) {
    let mut kept: Vec<&WorkspaceHost> = Vec::new();
    let mut unknown = Vec::new();
    for host in hosts {
        if kept.contains(&host) || unknown.contains(&host) {
            continue;
        }
        let is_known = known
            .iter()
            .any(|(owner, name)| *owner == host.owner && *name == host.runner);
        if is_known && kept.len() < MAX_WORKSPACE_HOSTS {
            kept.push(host);
        } else {
            unknown.push(host);
        }
    }
    (kept, unknown)
}

/// How many pending discards to send to a runner connection now, given how many were sent on
/// it and are not answered yet (at most [`DISCARDS_IN_FLIGHT`] outstanding).
pub fn discards_to_send(in_flight: usize, waiting: usize) -> usize {
    DISCARDS_IN_FLIGHT.saturating_sub(in_flight).min(waiting)
}

/// How many of the oldest pending discards to drop so that `count` stays within
/// [`MAX_PENDING_DISCARDS`].
pub fn discards_over_bound(count: usize) -> usize {
    count.saturating_sub(MAX_PENDING_DISCARDS)
}

/// Whether a runner's `discard_result` ends the pending discard it answers: only `ok` does (after
/// an error it is sent again by the hub's next sweep or at the runner's next connection). The
/// hub looks the discard up by the answering socket's own owner and runner name, so a runner can
/// only end its own.
pub fn discard_done(outcome: &DiscardOutcome) -> bool {
    matches!(outcome, DiscardOutcome::Ok { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, parent: Option<&str>, forked_from: Option<&str>) -> TreeRow {
        TreeRow {
            id: id.into(),
            parent_id: parent.map(Into::into),
            forked_from: forked_from.map(Into::into),
        }
    }

    #[test]
    fn forks_rule_table() {
        // a ─ child b ─ child c; f forks a, g forks c, h forks f; k forks b and is itself
        // (impossibly, but the rule must not care) a child of a.
        let rows = [
            row("a", None, None),
            row("b", Some("a"), None),
            row("c", Some("b"), None),
            row("f", None, Some("a")),
            row("g", None, Some("c")),
            row("h", None, Some("f")),
            row("k", Some("a"), Some("b")),
            row("x", None, None),
            // A cycle of parents does not loop forever.
            row("p", Some("q"), None),
            row("q", Some("p"), None),
        ];
        let cases: &[(&str, &[&str])] = &[
            // A session's own forks go with it; its descendants' go with theirs (b's deletion,
            // run by a's, takes k; c's takes g), and a fork's forks with the fork (h with f).
            ("a", &["f"]),
            ("b", &["k"]),
            ("c", &["g"]),
            ("f", &["h"]),
            ("g", &[]),
            ("h", &[]),
            ("x", &[]),
            ("p", &[]),
            // An unknown session (not listed) has no forks.
            ("zz", &[]),
        ];
        for (target, want) in cases {
            assert_eq!(forks_of(target, &rows), *want, "deleting {target}");
        }
        // Every fork of the tree goes: a's deletion reaches each through the children and
        // forks it takes, recursively.
        let mut gone = vec!["a".to_string()];
        let mut next = 0;
        while next < gone.len() {
            let id = gone[next].clone();
            next += 1;
            let children = rows
                .iter()
                .filter(|r| r.parent_id.as_deref() == Some(id.as_str()))
                .map(|r| r.id.clone());
            for more in children.chain(forks_of(&id, &rows)) {
                if !gone.contains(&more) {
                    gone.push(more);
                }
            }
        }
        gone.sort();
        assert_eq!(gone, ["a", "b", "c", "f", "g", "h", "k"]);
        assert_eq!(
            subtree("a", &rows).into_iter().collect::<Vec<_>>(),
            ["a", "b", "c", "k"]
        );
        assert_eq!(
            subtree("p", &rows).into_iter().collect::<Vec<_>>(),
            ["p", "q"]
        );
    }

    #[test]
    fn steps_run_in_order_and_storage_goes_last() {
        let mut deletion = Deletion {
            session_id: "s".into(),
            tenant: "t".into(),
            owner: "alice".into(),
            created_by: "alice".into(),
            access: Access::Private,
            parent_id: None,
            detached: false,
            title: None,
            cursor: 3,
            spent: None,
            requested_by: "alice".into(),
            steps_done: 0,
        };
        let mut seen = Vec::new();
        while let Some(step) = deletion.next_step() {
            // A repeat of a done step, or a step out of order, changes nothing.
            deletion.handle_step_done(Step::DropStorage);
            if step != Step::DropStorage {
                assert_eq!(deletion.next_step(), Some(step));
            }
            if let Some(done) = seen.last() {
                let before = deletion.clone();
                deletion.handle_step_done(*done);
                assert_eq!(deletion, before);
            }
            if step == Step::DropStorage {
                break;
            }
            deletion.handle_step_done(step);
            seen.push(step);
        }
        assert!(deletion.is_done());
        seen.push(Step::DropStorage);
        assert_eq!(seen, STEPS);
        // The storage that holds the mark goes last; the session leaves the list before its
        // children are deleted, and the parent hears of it before its objects go.
        assert_eq!(STEPS.last(), Some(&Step::DropStorage));
        let at = |s: Step| STEPS.iter().position(|x| *x == s).unwrap();
        assert!(at(Step::Stop) < at(Step::DisposeChildren));
        assert!(at(Step::Unlist) < at(Step::DisposeChildren));
        assert!(at(Step::TellParent) < at(Step::DeleteObjects));
        // The hosts list is read from the storage dropped last.
        assert!(at(Step::DiscardWorkspaces) < at(Step::DropStorage));
        // The stored form (the actor's `deletion` row) reads back.
        let json = serde_json::to_string(&deletion).unwrap();
        assert_eq!(serde_json::from_str::<Deletion>(&json).unwrap(), deletion);
    }

    #[test]
    fn object_prefixes_cover_every_per_session_key() {
        let s1 = "11111111-2222-3333-4444-555555555555";
        let prefixes = object_prefixes("acme", s1);
        let blob = crate::blobs::new_id(s1, [7; 16]);
        let keys = [
            crate::archive::segment_key("acme", s1, 1, 9),
            crate::out_of_line::blob_key("acme", s1, 7),
            crate::blobs::object_key("acme", crate::blobs::parse_id(&blob).unwrap()),
            crate::llm::request_log::object_key("acme", s1, 3, 1_700_000_000_000),
        ];
        for key in &keys {
            assert!(
                prefixes.iter().any(|p| key.starts_with(p.as_str())),
                "{key} is under no prefix"
            );
        }
        // No prefix reaches another session's keys (one id a prefix of another).
        for prefix in &prefixes {
            assert!(prefix.ends_with('/'), "{prefix}");
            assert!(prefix.contains(&format!("/{s1}/")), "{prefix}");
        }
    }

    #[test]
    fn session_ids_are_uuids_only() {
        let cases = [
            ("11111111-2222-3333-4444-555555555555", true),
            ("0f3c2a1b-AAAA-bbbb-cccc-0123456789ab", true),
            ("11111111-2222-3333-4444-55555555555", false),
            ("11111111-2222-3333-4444-5555555555555", false),
            ("11111111-2222-3333-4444-55555555555/", false),
            ("11111111222233334444-555555555555-", false),
            ("../../../../../../../../../../../..", false),
            ("111111112-222-3333-4444-555555555555", false),
            ("", false),
        ];
        for (id, want) in cases {
            assert_eq!(is_session_id(id), want, "{id:?}");
        }
    }

    fn attachment(owner: &str, runner: &str, kind: EnvironmentKind) -> Attachment {
        use crate::wire::runner::{AttachedEnvironment, RunnerKind, Snapshot};
        Attachment {
            environment: AttachedEnvironment {
                name: "web".into(),
                kind,
                root: "/w/s".into(),
                os: "Linux".into(),
                repo_path: None,
                branch: None,
                cell: Default::default(),
                snapshot: Snapshot::default(),
                agents_md: None,
                agents_md_truncated: false,
                agents_md_file: None,
            },
            runner: runner.into(),
            runner_owner: owner.into(),
            runner_kind: RunnerKind::Cloud,
            definition_id: None,
            definition_name: None,
            secrets: Vec::new(),
            cost_per_hour_usd: None,
            mcp_servers: Vec::new(),
            attached_at: 0,
        }
    }

    fn host(owner: &str, runner: &str) -> WorkspaceHost {
        WorkspaceHost {
            owner: owner.into(),
            runner: runner.into(),
        }
    }

    #[test]
    fn a_session_records_the_runners_of_its_copies_and_worktrees() {
        use EnvironmentKind::{FolderTemplate, Local, Worktree};
        // (attachments in order, hosts recorded, what the last one did)
        type Case<'a> = (
            Vec<(&'a str, &'a str, EnvironmentKind)>,
            Vec<(&'a str, &'a str)>,
            HostRecord,
        );
        let cases: Vec<Case> = vec![
            (
                vec![("ops", "cloud-a", FolderTemplate)],
                vec![("ops", "cloud-a")],
                HostRecord::Added,
            ),
            // The same runner again, and other kinds: nothing new.
            (
                vec![
                    ("ops", "cloud-a", FolderTemplate),
                    ("ops", "cloud-a", FolderTemplate),
                ],
                vec![("ops", "cloud-a")],
                HostRecord::Unchanged,
            ),
            (vec![("ana", "mac", Local)], vec![], HostRecord::Unchanged),
            // A worktree is the session's own too: removed with it (its branch kept).
            (
                vec![("ana", "mac", Worktree)],
                vec![("ana", "mac")],
                HostRecord::Added,
            ),
            (
                vec![("ana", "mac", Worktree), ("ana", "mac", FolderTemplate)],
                vec![("ana", "mac")],
                HostRecord::Unchanged,
            ),
            // The same name of another owner is another runner.
            (
                vec![
                    ("ops", "cloud-a", FolderTemplate),
                    ("bob", "cloud-a", FolderTemplate),
                ],
                vec![("ops", "cloud-a"), ("bob", "cloud-a")],
                HostRecord::Added,
            ),
        ];
        for (i, (attachments, want, last)) in cases.into_iter().enumerate() {
            let mut hosts = Vec::new();
            let mut did = HostRecord::Unchanged;
            for (owner, runner, kind) in attachments {
                did = record_workspace_host(&mut hosts, &attachment(owner, runner, kind));
            }
            let want: Vec<WorkspaceHost> = want.into_iter().map(|(o, r)| host(o, r)).collect();
            assert_eq!((hosts, did), (want, last), "case {i}");
        }
        // Bounded.
        let mut hosts = Vec::new();
        for n in 0..MAX_WORKSPACE_HOSTS {
            let name = format!("r{n}");
            assert_eq!(
                record_workspace_host(&mut hosts, &attachment("ops", &name, FolderTemplate)),
                HostRecord::Added
            );
        }
        assert_eq!(
            record_workspace_host(&mut hosts, &attachment("ops", "one-more", FolderTemplate)),
            HostRecord::Full
        );
        assert_eq!(hosts.len(), MAX_WORKSPACE_HOSTS);
    }

    #[test]
    fn discards_go_to_known_runners_only_bounded_and_end_on_ok() {
        let known = [("ops", "cloud-a"), ("ana", "mac")];
        // (hosts asked, kept, unknown)
        type Case<'a> = (
            Vec<(&'a str, &'a str)>,
            Vec<(&'a str, &'a str)>,
            Vec<(&'a str, &'a str)>,
        );
        let cases: Vec<Case> = vec![
            (vec![("ops", "cloud-a")], vec![("ops", "cloud-a")], vec![]),
            // A name of another owner, a freed name: not told.
            (
                vec![("ops", "cloud-a"), ("eve", "cloud-a"), ("ops", "gone")],
                vec![("ops", "cloud-a")],
                vec![("eve", "cloud-a"), ("ops", "gone")],
            ),
            // Each once.
            (
                vec![("ana", "mac"), ("ana", "mac"), ("ops", "cloud-a")],
                vec![("ana", "mac"), ("ops", "cloud-a")],
                vec![],
            ),
            (vec![], vec![], vec![]),
        ];
        for (i, (asked, kept, unknown)) in cases.into_iter().enumerate() {
            let asked: Vec<WorkspaceHost> = asked.into_iter().map(|(o, r)| host(o, r)).collect();
            let (got_kept, got_unknown) = discard_targets(&asked, &known);
            let names = |v: Vec<&WorkspaceHost>| {
                v.into_iter()
                    .map(|h| (h.owner.clone(), h.runner.clone()))
                    .collect::<Vec<_>>()
            };
            let want = |v: Vec<(&str, &str)>| {
                v.into_iter()
                    .map(|(o, r)| (o.to_string(), r.to_string()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(
                (names(got_kept), names(got_unknown)),
                (want(kept), want(unknown)),
                "case {i}"
            );
        }
        // (in flight, waiting, to send now)
        for (in_flight, waiting, want) in [
            (0, 0, 0),
            (0, 3, 3),
            (0, 100, DISCARDS_IN_FLIGHT),
            (DISCARDS_IN_FLIGHT - 1, 100, 1),
            (DISCARDS_IN_FLIGHT, 100, 0),
            (DISCARDS_IN_FLIGHT + 3, 100, 0),
        ] {
            assert_eq!(
                discards_to_send(in_flight, waiting),
                want,
                "{in_flight} {waiting}"
            );
        }
        for (count, drop) in [
            (0, 0),
            (MAX_PENDING_DISCARDS, 0),
            (MAX_PENDING_DISCARDS + 1, 1),
            (MAX_PENDING_DISCARDS + 40, 40),
        ] {
            assert_eq!(discards_over_bound(count), drop, "{count}");
        }
        assert!(discard_done(&DiscardOutcome::Ok {
            objects: 0,
            local: 0
        }));
        assert!(!discard_done(&DiscardOutcome::Error(
            crate::wire::runner::ErrorBody::new("store_failed", "down")
        )));
    }
}
