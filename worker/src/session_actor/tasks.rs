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
use wasm_bindgen_futures::spawn_local;
use wuhu_core::wire::ToolCall;

use super::{Actor, inference, tools};
use crate::runner_calls::cancel_on_runner;

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
    pub(crate) fn abort_all(&self) {
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
        if let Ok(mut running) = self.actor.in_flight.tasks.running.try_borrow_mut() {
            running.remove(&self.id);
        }
    }
}

fn spawn(actor: &Rc<Actor>, step: u64, kind: TaskKind, work: impl Future<Output = ()> + 'static) {
    let (id, registration) = actor.in_flight.tasks.add(step, kind);
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
        tools::run(actor.clone(), step, call),
    );
}

/// `Effect::CancelInference`: the streaming request is aborted; nothing of it is kept.
pub(crate) fn cancel_inference(actor: &Rc<Actor>, step: u64) {
    actor.in_flight.tasks.abort(step, TaskKind::Inference);
}

/// `Effect::CancelTools`: sends `cancel` for every runner call of the step, then aborts the
/// step's tool tasks (their results are no longer wanted: the session already recorded
/// "stopped").
pub(crate) fn cancel_tools(actor: &Rc<Actor>, step: u64) {
    for call in actor.in_flight.runner_calls.take_step(step) {
        spawn_local(cancel_on_runner(
            actor.env.clone(),
            actor.tenant(),
            actor.in_flight.runner_calls.clone(),
            call,
        ));
    }
    actor.in_flight.tasks.abort(step, TaskKind::Tool);
}

/// After a failed write drops the session: every task of this isolate is aborted and every
/// runner call it made is cancelled, so the reloaded session's resumed step is the only one
/// running (an old task finishing later would otherwise deliver into the reloaded session).
pub(crate) fn abandon_all(actor: &Rc<Actor>) {
    for call in actor.in_flight.runner_calls.take_all() {
        spawn_local(cancel_on_runner(
            actor.env.clone(),
            actor.tenant(),
            actor.in_flight.runner_calls.clone(),
            call,
        ));
    }
    actor.in_flight.tasks.abort_all();
}

impl Actor {
    /// [`abandon_all`], for the modules that drop the loaded session (a failed write, a test's
    /// fault point).
    pub(super) fn abandon_tasks(self: &Rc<Self>) {
        abandon_all(self);
    }
}

/// After a restart: cancels every runner call a task of the previous isolate left running.
/// Runs before the session resumes, so a resumed step never races its predecessor's command.
pub(crate) fn cancel_orphans(actor: &Rc<Actor>) {
    for call in actor.in_flight.runner_calls.orphans() {
        spawn_local(cancel_on_runner(
            actor.env.clone(),
            actor.tenant(),
            actor.in_flight.runner_calls.clone(),
            call,
        ));
    }
}
