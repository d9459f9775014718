//! Discarding a deleted session's workspaces on the runners that hosted them (decision 0017).
//!
//! `Discard` (internal, from the session's deletion step) keeps one pending discard per
//! host in SQLite (`pending_discards`) before it answers, then sends `discard_workspaces` to
//! the hosts that are connected. A runner that is away gets it when it says hello next. Only
//! the runner's `discard_result` with `ok`, on a socket of that very runner, removes it; after
//! an error it is sent again by the next liveness sweep (or connection). The
//! rules are `wuhu_core::deletion`'s (`discard_targets`, `discards_to_send`,
//! `discards_over_bound`, `discard_done`).

use worker::{SqlStorage, WebSocket};
use wuhu_core::deletion;
use wuhu_core::wire::runner::{
    DiscardOutcome, DiscardWorkspacesRequest, DiscardWorkspacesResponse, ServerMessage,
};

use super::socket_state::{SocketInfo, now_ms, send};
use super::store;
use crate::http::{ApiError, ApiResult};

/// `Discard`.
pub(super) fn discard(
    sql: &SqlStorage,
    find: impl Fn(&str, &str) -> Option<(WebSocket, SocketInfo)>,
    request: &DiscardWorkspacesRequest,
) -> ApiResult<DiscardWorkspacesResponse> {
    let session_id = request.session_id.as_str();
    if !deletion::is_session_id(session_id) {
        return Err(ApiError::bad_request(format!(
            "{session_id:?} is not a session id"
        )));
    }
    let names = store::names(sql)?;
    let known: Vec<(&str, &str)> = names
        .iter()
        .map(|r| (r.owner.as_str(), r.name.as_str()))
        .collect();
    let (kept, unknown) = deletion::discard_targets(&request.hosts, &known);
    let now = now_ms();
    for host in &kept {
        store::add_discard(sql, &host.owner, &host.runner, session_id, now)?;
    }
    let over = deletion::discards_over_bound(store::count_discards(sql)?);
    if over > 0 {
        for row in store::drop_oldest_discards(sql, over)? {
            worker::console_log!(
                "runner hub: dropped the pending discard of session {} on runner {:?} of {} ({} are kept at most): its workspaces stay in that runner's store",
                row.session_id,
                row.runner,
                row.owner,
                deletion::MAX_PENDING_DISCARDS
            );
        }
    }
    for host in &unknown {
        worker::console_log!(
            "runner hub: session {session_id}: runner {:?} of {} is no runner of the tenant any more; its copy is not discarded",
            host.runner,
            host.owner
        );
    }
    // Stored first: what follows only speeds delivery up.
    let mut sent = 0;
    for host in &kept {
        if let Some((ws, info)) = find(&host.owner, &host.runner) {
            sent += send_waiting(sql, &ws, &info)?;
        }
    }
    Ok(DiscardWorkspacesResponse {
        pending: kept.len(),
        sent,
        unknown: unknown.into_iter().cloned().collect(),
    })
}

/// Sends a welcomed runner's waiting discards, at most `DISCARDS_IN_FLIGHT` unanswered on this
/// connection. Returns how many were sent.
pub(super) fn send_waiting(
    sql: &SqlStorage,
    ws: &WebSocket,
    info: &SocketInfo,
) -> ApiResult<usize> {
    let Some(runner) = &info.runner else {
        return Ok(0);
    };
    let (waiting, in_flight) = store::discards_for(
        sql,
        &info.owner,
        &runner.name,
        info.epoch,
        deletion::DISCARDS_IN_FLIGHT,
    )?;
    let n = deletion::discards_to_send(in_flight, waiting.len());
    let mut sent = 0;
    for row in waiting.into_iter().take(n) {
        let message = ServerMessage::DiscardWorkspaces {
            id: format!("discard-{}", row.session_id),
            session_id: row.session_id.clone(),
        };
        if !send(ws, &message) {
            break;
        }
        store::mark_discard_sent(sql, &row, info.epoch)?;
        sent += 1;
    }
    Ok(sent)
}

/// A runner's `discard_result`: an `ok` ends the pending discard of that runner (looked up by
/// the socket's own owner and name, never by what the frame says about the runner), then the
/// next waiting one goes; an error is logged and the discard is sent again by the next sweep.
pub(super) fn on_result(
    sql: &SqlStorage,
    ws: &WebSocket,
    info: &SocketInfo,
    session_id: &str,
    outcome: &DiscardOutcome,
) {
    let Some(runner) = &info.runner else {
        return;
    };
    let result = (|| -> ApiResult<()> {
        if !deletion::discard_done(outcome) {
            let why = match outcome {
                DiscardOutcome::Error(error) => format!("{}: {}", error.code, error.message),
                DiscardOutcome::Ok { .. } => String::from("not done"),
            };
            worker::console_log!(
                "runner hub: runner {:?} of {} could not discard the workspaces of session {session_id} (sent again at the next sweep or connection): {why}",
                runner.name,
                info.owner
            );
            store::unsend_discard(sql, &info.owner, &runner.name, session_id)?;
            return Ok(());
        }
        let known = store::remove_discard(sql, &info.owner, &runner.name, session_id)?;
        let (objects, local) = match outcome {
            DiscardOutcome::Ok { objects, local } => (*objects, *local),
            DiscardOutcome::Error(_) => (0, 0),
        };
        worker::console_log!(
            "runner hub: runner {:?} of {} discarded the workspaces of session {session_id} ({objects} objects, {local} local copies){}",
            runner.name,
            info.owner,
            if known {
                ""
            } else {
                " (no such pending discard)"
            }
        );
        send_waiting(sql, ws, info)?;
        Ok(())
    })();
    if let Err(e) = result {
        worker::console_error!("runner hub: recording a discard failed: {}", e.message);
    }
}
