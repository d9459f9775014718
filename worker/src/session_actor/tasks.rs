//! The actor's effect tasks. Every inference and tool task of a step runs under an abort handle
//! that the actor keeps, so `Effect::CancelInference` / `Effect::CancelTools` end it at once
//! (the provider request is aborted with it), and every `tool_call` a task sends to a runner is
//! recorded, so cancelling the step also sends `cancel` to that runner, which kills the
//! command's process group.
//!
//! The runner calls in flight are also rows of SQLite (`runner_calls`): an actor that restarts
//! (its tasks died with the isolate) cancels what its dead tasks left running before it resumes
//! the session. A call's row goes away when the call ends, or once its `cancel` reached the hub.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use futures::future::{AbortHandle, AbortRegistration, Abortable};
use serde::Deserialize;
use wasm_bindgen_futures::spawn_local;
use worker::{Env, SqlStorage};
use wuhu_core::wire::ToolCall;

use super::Actor;
use crate::{builtin_tools, inference, internal, runner_client};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TaskKind {
    Inference,
    Tool,
}

struct Task {
    step: u64,
    kind: TaskKind,
    abort: AbortHandle,
}

/// The running tasks of one actor, by task id.
#[derive(Default)]
pub(crate) struct Tasks {
    next_id: Cell<u64>,
    running: RefCell<HashMap<u64, Task>>,
}

impl Tasks {
    /// How many inference and tool tasks run in this isolate (zero after a restart).
    pub(crate) fn count(&self) -> usize {
        self.running.borrow().len()
    }

    fn add(&self, step: u64, kind: TaskKind) -> (u64, AbortRegistration) {
        let (abort, registration) = AbortHandle::new_pair();
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        self.running
            .borrow_mut()
            .insert(id, Task { step, kind, abort });
        (id, registration)
    }

    /// Aborts every task.
    fn abort_all(&self) {
        let handles: Vec<AbortHandle> = self
            .running
            .borrow()
            .values()
            .map(|t| t.abort.clone())
            .collect();
        for handle in handles {
            handle.abort();
        }
    }

    /// Aborts the tasks of `kind` for `step`; each ends at its next poll, dropping its future.
    fn abort(&self, step: u64, kind: TaskKind) {
        let handles: Vec<AbortHandle> = self
            .running
            .borrow()
            .values()
            .filter(|t| t.step == step && t.kind == kind)
            .map(|t| t.abort.clone())
            .collect();
        for handle in handles {
            handle.abort();
        }
    }
}

/// Removes its task from [`Tasks`] when the task's future ends or is dropped (aborted).
struct Registered {
    actor: Rc<Actor>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut running) = self.actor.tasks.running.try_borrow_mut() {
            running.remove(&self.id);
        }
    }
}

fn spawn(actor: &Rc<Actor>, step: u64, kind: TaskKind, work: impl Future<Output = ()> + 'static) {
    let (id, registration) = actor.tasks.add(step, kind);
    let registered = Registered {
        actor: actor.clone(),
        id,
    };
    let task = Abortable::new(
        async move {
            let _registered = registered;
            work.await;
        },
        registration,
    );
    spawn_local(async move {
        let _ = task.await;
    });
}

/// `Effect::Infer`.
pub(crate) fn spawn_inference(actor: &Rc<Actor>, step: u64) {
    spawn(
        actor,
        step,
        TaskKind::Inference,
        inference::run(actor.clone(), step),
    );
}

/// `Effect::RunTools`, one task per call.
pub(crate) fn spawn_tool(actor: &Rc<Actor>, step: u64, call: ToolCall) {
    spawn(
        actor,
        step,
        TaskKind::Tool,
        builtin_tools::run(actor.clone(), step, call),
    );
}

/// `Effect::CancelInference`: the streaming request is aborted; nothing of it is kept.
pub(crate) fn cancel_inference(actor: &Rc<Actor>, step: u64) {
    actor.tasks.abort(step, TaskKind::Inference);
}

/// `Effect::CancelTools`: sends `cancel` for every runner call of the step, then aborts the
/// step's tool tasks (their results are no longer wanted: the session already recorded
/// "stopped").
pub(crate) fn cancel_tools(actor: &Rc<Actor>, step: u64) {
    for call in actor.runner_calls.take_step(step) {
        spawn_local(cancel_on_runner(
            actor.env.clone(),
            actor.tenant(),
            actor.runner_calls.clone(),
            call,
        ));
    }
    actor.tasks.abort(step, TaskKind::Tool);
}

/// After a failed write drops the session: every task of this isolate is aborted and every
/// runner call it made is cancelled, so the reloaded session's resumed step is the only one
/// running (an old task finishing later would otherwise deliver into the reloaded session).
pub(crate) fn abandon_all(actor: &Rc<Actor>) {
    for call in actor.runner_calls.take_all() {
        spawn_local(cancel_on_runner(
            actor.env.clone(),
            actor.tenant(),
            actor.runner_calls.clone(),
            call,
        ));
    }
    actor.tasks.abort_all();
}

/// After a restart: cancels every runner call a task of the previous isolate left running.
/// Runs before the session resumes, so a resumed step never races its predecessor's command.
pub(crate) fn cancel_orphans(actor: &Rc<Actor>) {
    for call in actor.runner_calls.orphans() {
        spawn_local(cancel_on_runner(
            actor.env.clone(),
            actor.tenant(),
            actor.runner_calls.clone(),
            call,
        ));
    }
}

async fn cancel_on_runner(env: Env, tenant: String, calls: Rc<RunnerCalls>, call: RunnerCall) {
    let result = runner_client::cancel(
        &env,
        &tenant,
        &call.sub,
        &call.runner,
        &call.owner,
        &call.id,
    )
    .await;
    match result {
        // Delivered, or the runner has no live connection: a runner cancels everything it
        // runs when its connection drops, so there is nothing left to stop.
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
struct RunnerCall {
    /// The request id sent to the runner (what `cancel` names).
    id: String,
    step: f64,
    runner: String,
    /// The runner's owner.
    owner: String,
    /// On whose behalf the hub is asked (the session's owner).
    sub: String,
}

/// Runner calls in flight, in memory and in SQLite (`runner_calls`).
pub(crate) struct RunnerCalls {
    sql: Option<SqlStorage>,
    live: RefCell<HashMap<String, RunnerCall>>,
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
        }
    }

    /// Records a call before it is sent; the guard forgets it when the call ends.
    pub(crate) fn track(
        self: &Rc<Self>,
        step: u64,
        id: &str,
        runner: &str,
        owner: &str,
        sub: &str,
    ) -> TrackedCall {
        let call = RunnerCall {
            id: id.to_string(),
            step: step as f64,
            runner: runner.to_string(),
            owner: owner.to_string(),
            sub: sub.to_string(),
        };
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
    fn take_step(&self, step: u64) -> Vec<RunnerCall> {
        let mut live = self.live.borrow_mut();
        let ids: Vec<String> = live
            .values()
            .filter(|c| c.step as u64 == step)
            .map(|c| c.id.clone())
            .collect();
        ids.iter().filter_map(|id| live.remove(id)).collect()
    }

    /// Takes every live call out of memory; their rows stay until the cancel is sent.
    fn take_all(&self) -> Vec<RunnerCall> {
        self.live
            .borrow_mut()
            .drain()
            .map(|(_, call)| call)
            .collect()
    }

    /// Rows without a live call in this isolate: left by tasks of a previous one.
    fn orphans(&self) -> Vec<RunnerCall> {
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
        self.live.borrow_mut().remove(id);
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
    pub(crate) calls: Rc<RunnerCalls>,
    pub(crate) step: u64,
}

impl RunnerCallScope {
    /// Records `id` (a `tool_call` about to be sent to `owner`'s `runner` on behalf of `sub`).
    pub(crate) fn track(&self, id: &str, runner: &str, owner: &str, sub: &str) -> TrackedCall {
        self.calls.track(self.step, id, runner, owner, sub)
    }
}
