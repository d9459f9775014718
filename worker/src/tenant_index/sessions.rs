//! The tenant's session list (newest first), its tombstones of deleted sessions, and the tree
//! rows of children and forks the forks rule of a deletion reads.

use serde::Deserialize;
use wuhu_core::authority::{self, Principal, SessionAction, SessionFacts, Verdict};
use wuhu_core::calls::index::List;
use wuhu_core::deletion::TreeRow;
use wuhu_core::wire::{ListSessionsResponse, SessionInfo};

use super::TenantIndex;
use crate::auth::Identity;
use crate::http::{ApiError, ApiResult};

/// Rows read from SQLite per batch while filtering a page.
const SCAN_BATCH: usize = 200;
/// Most rows one list request scans; past that the page is returned short, with `nextBefore`.
const MAX_SCANNED: usize = 2_000;

#[derive(Deserialize)]
struct ListRow {
    seq: f64,
    info: String,
}

#[derive(Deserialize)]
struct SeqRow {
    seq: f64,
}

/// A row of the tree query: a listed session that is a child or a fork.
#[derive(Deserialize)]
struct TreeSqlRow {
    id: String,
    #[serde(default)]
    parent_id: Option<String>,
    #[serde(default)]
    forked_from: Option<String>,
}

fn visible(viewer: &Principal, info: &SessionInfo) -> bool {
    authority::session_allows(viewer, facts_of(info), SessionAction::Read) == Verdict::Allow
}

/// A listed session's authority facts (its owner: the first prompter, else its creator).
fn facts_of(info: &SessionInfo) -> SessionFacts<'_> {
    let owner = if info.owner.is_empty() {
        &info.created_by
    } else {
        &info.owner
    };
    SessionFacts {
        owner,
        created_by: &info.created_by,
        access: info.access,
    }
}

impl TenantIndex {
    /// Refreshes a session's row (never a deleted one's), or records a new session.
    pub(super) fn upsert(&self, info: &SessionInfo, created: bool) -> ApiResult<()> {
        let json = serde_json::to_string(info).map_err(|e| ApiError::internal(e.to_string()))?;
        if created {
            self.sql.exec(
                "DELETE FROM deleted_sessions WHERE id = ?",
                vec![info.id.clone().into()],
            )?;
        } else {
            let deleted: Vec<SeqRow> = self
                .sql
                .exec(
                    "SELECT 0 AS seq FROM deleted_sessions WHERE id = ?",
                    vec![info.id.clone().into()],
                )?
                .to_array()?;
            if !deleted.is_empty() {
                return Ok(());
            }
        }
        self.sql.exec(
            "INSERT INTO session_list (id, info) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET info = excluded.info",
            vec![info.id.clone().into(), json.into()],
        )?;
        Ok(())
    }

    /// The sessions `viewer` may see, newest first.
    /// The sessions the caller may see (or, for a session's tools, its readers), newest first.
    pub(super) fn list(&self, viewer: &Identity, list: &List) -> ApiResult<ListSessionsResponse> {
        let viewer_principal = viewer.principal();
        let visible = |info: &SessionInfo| match &list.readers {
            Some(readers) => {
                readers.may_read(&viewer.tenant, facts_of(info), info.parent_id.as_deref())
            }
            None => visible(&viewer_principal, info),
        };
        let limit = list.limit;
        let parent = list.parent_id.as_deref();
        let mut anchor = match list.before.as_deref() {
            None => i64::MAX,
            Some(before) => {
                let rows: Vec<SeqRow> = self
                    .sql
                    .exec(
                        "SELECT seq FROM session_list WHERE id = ?",
                        vec![before.into()],
                    )?
                    .to_array()?;
                let Some(row) = rows.into_iter().next() else {
                    return Err(ApiError::bad_request(
                        "before must be the id of a listed session",
                    ));
                };
                row.seq as i64
            }
        };
        // Sessions the viewer may not read are skipped (core's rule decides). A page scans at
        // most MAX_SCANNED rows; a short page then still has `nextBefore`.
        let mut sessions: Vec<SessionInfo> = Vec::new();
        let mut scanned = 0usize;
        let mut last_scanned: Option<String> = None;
        let mut exhausted = false;
        while sessions.len() <= limit as usize && scanned < MAX_SCANNED {
            let rows: Vec<ListRow> = self
                .sql
                .exec(
                    "SELECT seq, info FROM session_list WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                    vec![anchor.into(), (SCAN_BATCH as i64).into()],
                )?
                .to_array()?;
            if rows.len() < SCAN_BATCH {
                exhausted = true;
            }
            for row in rows {
                anchor = row.seq as i64;
                scanned += 1;
                let Ok(info) = serde_json::from_str::<SessionInfo>(&row.info) else {
                    continue;
                };
                last_scanned = Some(info.id.clone());
                let in_tree = parent.is_none_or(|p| info.parent_id.as_deref() == Some(p));
                if sessions.len() <= limit as usize && in_tree && visible(&info) {
                    sessions.push(info);
                }
            }
            if exhausted {
                break;
            }
        }
        let more = sessions.len() > limit as usize;
        sessions.truncate(limit as usize);
        let next_before = if more {
            sessions.last().map(|s| s.id.clone())
        } else if !exhausted {
            last_scanned
        } else {
            None
        };
        Ok(ListSessionsResponse {
            sessions,
            next_before,
        })
    }

    /// A deleted session leaves the list for good (and stops holding the settings).
    pub(super) fn remove(&self, id: &str) -> ApiResult<()> {
        self.sql.exec(
            "INSERT INTO deleted_sessions (id) VALUES (?) ON CONFLICT(id) DO NOTHING",
            vec![id.into()],
        )?;
        self.sql.exec(
            "DELETE FROM settings_holders WHERE session = ?",
            vec![id.into()],
        )?;
        self.sql
            .exec("DELETE FROM session_list WHERE id = ?", vec![id.into()])?;
        Ok(())
    }

    /// The listed children and forks (only they matter to the forks rule; the rest is not
    /// read).
    pub(super) fn tree(&self) -> ApiResult<Vec<TreeRow>> {
        let rows: Vec<TreeSqlRow> = self
            .sql
            .exec(
                "SELECT id, json_extract(info, '$.parentId') AS parent_id, json_extract(info, '$.forkedFrom.sessionId') AS forked_from FROM session_list WHERE json_extract(info, '$.parentId') IS NOT NULL OR json_extract(info, '$.forkedFrom.sessionId') IS NOT NULL",
                None,
            )?
            .to_array()?;
        Ok(rows
            .into_iter()
            .map(|r| TreeRow {
                id: r.id,
                parent_id: r.parent_id,
                forked_from: r.forked_from,
            })
            .collect())
    }
}
