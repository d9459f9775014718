//! Runner calls in flight: every `tool_call` a session's tool sends to a runner is recorded
//! (in memory and in the actor's SQLite table `runner_calls`) until it ends, so stopping the
//! step, or a restart of the actor, can send `cancel` to that runner, which kills the command's
//! process group. A call's row goes away when the call ends, or once its `cancel` reached the
//! hub.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use std::time::Duration;

use serde::Deserialize;
use worker::{Delay, Env, SqlStorage};
use wuhu_core::hub::ORPHAN_CANCEL_RETRY_MS;
use wuhu_core::masking::Masker;
use wuhu_core::tool_output::LiveOutput;
use wuhu_core::wire::StreamEvent;
use wuhu_core::wire::runner::ToolOutputRelay;

use crate::{internal, runner_client};

/// Sends `cancel` for `call` to its runner through the hub, again after each of
/// [`ORPHAN_CANCEL_RETRY_MS`] while the runner is not connected; forgets the call once delivered
/// or given up.
pub(crate) async fn cancel_on_runner(
    env: Env,
    tenant: String,
    calls: Rc<RunnerCalls>,
    call: RunnerCall,
) {
    let mut pauses = ORPHAN_CANCEL_RETRY_MS.iter();
    let result = loop {
        let result = runner_client::cancel(
            &env,
            &tenant,
            &call.sub,
            &call.runner,
            &call.owner,
            &call.id,
        )
        .await;
        match (&result, pauses.next()) {
            // Not connected (yet): a runner that reconnects within the pauses still gets it.
            (Err(e), Some(&pause)) if e.code == internal::codes::RUNNER_NOT_CONNECTED => {
                Delay::from(Duration::from_millis(pause)).await;
            }
            _ => break result,
        }
    };
    match result {
        // Delivered, or the runner stayed away: a runner cancels everything it runs when its
        // connection drops, so there is nothing left to stop.
        Ok(()) => calls.forget(&call.id),
        Err(e) if e.code == internal::codes::RUNNER_NOT_CONNECTED => calls.forget(&call.id),
        Err(e) => {
            // Kept: the next start of this actor tries again.
            worker::console_error!(
                "cancelling runner call {} on {:?} failed ({}): {}",
                call.id,
                call.runner,
                e.code,
                e.message
            );
        }
    }
}

/// A `tool_call` sent to a runner whose answer has not arrived.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct RunnerCall {
    /// The request id sent to the runner (what `cancel` names).
    id: String,
    step: f64,
    runner: String,
    /// The runner's owner.
    owner: String,
    /// On whose behalf the hub is asked (the session's owner).
    sub: String,
    /// The model's tool call it serves (in memory only: what its live output is shown as).
    #[serde(skip)]
    tool_call_id: String,
}

/// Runner calls in flight, in memory and in SQLite (`runner_calls`).
pub(crate) struct RunnerCalls {
    sql: Option<SqlStorage>,
    live: RefCell<HashMap<String, RunnerCall>>,
    /// The live output of the calls in `live` (`wuhu_core::tool_output::LiveOutput`), by
    /// their tool call ids.
    output: RefCell<LiveOutput>,
}

/// At most this many rows are kept; a step rarely has more than a few runner calls.
const MAX_ROWS: usize = 256;

impl RunnerCalls {
    pub(crate) fn open(sql: SqlStorage) -> RunnerCalls {
        let created = sql.exec(
            "CREATE TABLE IF NOT EXISTS runner_calls (id TEXT PRIMARY KEY, step INTEGER NOT NULL, runner TEXT NOT NULL, owner TEXT NOT NULL, sub TEXT NOT NULL)",
            None,
        );
        if let Err(e) = &created {
            worker::console_error!("creating runner_calls failed: {e}");
        }
        RunnerCalls {
            sql: created.ok().map(|_| sql),
            live: RefCell::new(HashMap::new()),
            output: RefCell::new(LiveOutput::default()),
        }
    }

    /// Records a call before it is sent; the guard forgets it when the call ends. Its live
    /// output is relayed as `tool_call_id`'s, masked with `masker`, until then.
    pub(crate) fn track(
        self: &Rc<Self>,
        step: u64,
        id: &str,
        runner: &str,
        owner: &str,
        sub: &str,
        live: Option<(&str, &Masker)>,
    ) -> TrackedCall {
        let call = RunnerCall {
            id: id.to_string(),
            step: step as f64,
            runner: runner.to_string(),
            owner: owner.to_string(),
            sub: sub.to_string(),
            tool_call_id: live.map(|(call, _)| call.to_string()).unwrap_or_default(),
        };
        if let Some((tool_call_id, masker)) = live {
            self.output.borrow_mut().start(tool_call_id, masker.clone());
        }
        if let Some(sql) = &self.sql
            && self.live.borrow().len() < MAX_ROWS
            && let Err(e) = sql.exec(
                "INSERT OR REPLACE INTO runner_calls (id, step, runner, owner, sub) VALUES (?, ?, ?, ?, ?)",
                vec![
                    call.id.clone().into(),
                    call.step.into(),
                    call.runner.clone().into(),
                    call.owner.clone().into(),
                    call.sub.clone().into(),
                ],
            )
        {
            worker::console_error!("recording runner call {id} failed: {e}");
        }
        self.live.borrow_mut().insert(call.id.clone(), call);
        TrackedCall {
            calls: self.clone(),
            id: id.to_string(),
        }
    }

    /// Takes the live calls of `step` out of memory; their rows stay until the cancel is sent.
    pub(crate) fn take_step(&self, step: u64) -> Vec<RunnerCall> {
        let mut live = self.live.borrow_mut();
        let ids: Vec<String> = live
            .values()
            .filter(|c| c.step as u64 == step)
            .map(|c| c.id.clone())
            .collect();
        let taken: Vec<RunnerCall> = ids.iter().filter_map(|id| live.remove(id)).collect();
        self.end_output(&taken);
        taken
    }

    /// Takes every live call out of memory; their rows stay until the cancel is sent.
    pub(crate) fn take_all(&self) -> Vec<RunnerCall> {
        let taken: Vec<RunnerCall> = self
            .live
            .borrow_mut()
            .drain()
            .map(|(_, call)| call)
            .collect();
        self.end_output(&taken);
        taken
    }

    fn end_output(&self, calls: &[RunnerCall]) {
        let mut output = self.output.borrow_mut();
        for call in calls {
            output.end(&call.tool_call_id);
        }
    }

    /// A frame of runner call `id`'s output: the event for followers, when the call is live
    /// here and something can be shown.
    pub(crate) fn output(&self, relay: &ToolOutputRelay) -> Option<StreamEvent> {
        let live = self.live.borrow();
        let call = live.get(&relay.runner_call_id)?;
        self.output
            .borrow_mut()
            .push(&call.tool_call_id, relay.stream, &relay.text)
    }

    /// Starts the live output of tool call `tool_call_id` that the Worker itself produces (an
    /// MCP server's progress): shown like a runner call's, masked with `masker`.
    pub(crate) fn start_local_output(&self, tool_call_id: &str, masker: &Masker) {
        self.output.borrow_mut().start(tool_call_id, masker.clone());
    }

    /// More of that output: the event for followers, when something can be shown.
    pub(crate) fn local_output(&self, tool_call_id: &str, text: &str) -> Option<StreamEvent> {
        self.output.borrow_mut().push(
            tool_call_id,
            wuhu_core::wire::runner::OutputStream::Combined,
            text,
        )
    }

    /// Ends that output.
    pub(crate) fn end_local_output(&self, tool_call_id: &str) {
        self.output.borrow_mut().end(tool_call_id);
    }

    /// What a follower that joins now gets first: the recent output of the running calls.
    pub(crate) fn output_tails(&self) -> Vec<StreamEvent> {
        self.output.borrow().tails()
    }

    /// Rows without a live call in this isolate: left by tasks of a previous one.
    pub(crate) fn orphans(&self) -> Vec<RunnerCall> {
        let Some(sql) = &self.sql else {
            return Vec::new();
        };
        let rows: Vec<RunnerCall> = match sql
            .exec(
                "SELECT id, step, runner, owner, sub FROM runner_calls LIMIT ?",
                vec![(MAX_ROWS as f64).into()],
            )
            .and_then(|c| c.to_array())
        {
            Ok(rows) => rows,
            Err(e) => {
                worker::console_error!("reading runner_calls failed: {e}");
                return Vec::new();
            }
        };
        let live = self.live.borrow();
        rows.into_iter()
            .filter(|r| !live.contains_key(&r.id))
            .collect()
    }

    fn forget(&self, id: &str) {
        if let Some(call) = self.live.borrow_mut().remove(id) {
            self.output.borrow_mut().end(&call.tool_call_id);
        }
        if let Some(sql) = &self.sql
            && let Err(e) = sql.exec("DELETE FROM runner_calls WHERE id = ?", vec![id.into()])
        {
            worker::console_error!("forgetting runner call {id} failed: {e}");
        }
    }
}

/// A recorded runner call; dropping it (the call ended, or its task was aborted) forgets the
/// call unless a cancel took it over.
pub(crate) struct TrackedCall {
    calls: Rc<RunnerCalls>,
    id: String,
}

impl Drop for TrackedCall {
    fn drop(&mut self) {
        let still_live = self
            .calls
            .live
            .try_borrow()
            .is_ok_and(|live| live.contains_key(&self.id));
        if still_live {
            self.calls.forget(&self.id);
        }
    }
}

/// What a tool task gets to record its runner calls under its step.
#[derive(Clone)]
pub(crate) struct RunnerCallScope {
    calls: Rc<RunnerCalls>,
    step: u64,
}

impl RunnerCallScope {
    pub(crate) fn new(calls: Rc<RunnerCalls>, step: u64) -> RunnerCallScope {
        RunnerCallScope { calls, step }
    }

    /// Records `id` (a `tool_call` about to be sent to `owner`'s `runner` on behalf of `sub`),
    /// whose live output is tool call `live.0`'s, masked with `live.1`.
    pub(crate) fn track(
        &self,
        id: &str,
        runner: &str,
        owner: &str,
        sub: &str,
        live: Option<(&str, &Masker)>,
    ) -> TrackedCall {
        self.calls.track(self.step, id, runner, owner, sub, live)
    }
}
