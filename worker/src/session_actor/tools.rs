//! Tool calls as actor tasks: the complete context a call gets, and applying its output.
//! The tools themselves (`crate::builtin_tools`, `crate::environment_tools`, `crate::js_tool`)
//! never see the actor.

use std::rc::Rc;

use wuhu_core::tools::names;
use wuhu_core::wire::ToolCall;

use super::approvals::ActorApprovals;
use super::children::ActorChildren;
use super::{Actor, now};
use crate::runner_calls::RunnerCallScope;
use crate::tool_context::{AttachmentChange, ParentFacts, ToolContext, ToolOutput};
use crate::{builtin_tools, environment_tools, orchestration_tools};

/// One tool call of `step`, run as an actor task (see [`super::tasks`]): aborting the task
/// drops this future wherever it waits.
pub(super) async fn run(actor: Rc<Actor>, step: u64, call: ToolCall) {
    // A CPU-bound tool (a js script) yields to the event loop first: otherwise it would run in
    // the same microtask chain as the step that started it, holding back streamed output and
    // other requests to this session (stop, follow) until the whole step is done. Tools that
    // do I/O yield at their first await anyway.
    if call.name == names::JS {
        worker::Delay::from(std::time::Duration::ZERO).await;
    }
    if !actor
        .with_loaded(|l| l.session.is_tool_running(step, &call.id))
        .unwrap_or(false)
    {
        return; // Stopped before it started.
    }
    let context = actor.tool_context(step);
    let output = if environment_tools::handles(&call) {
        environment_tools::execute(&context, &call).await
    } else if orchestration_tools::handles(&call) {
        ToolOutput::text(orchestration_tools::execute(&context, &call).await)
    } else {
        ToolOutput::text(builtin_tools::execute(&context, &call).await)
    };
    actor.finish_tool(step, &call.id, output);
}

impl Actor {
    /// The complete context a tool call gets.
    fn tool_context(self: &Rc<Self>, step: u64) -> ToolContext {
        ToolContext {
            env: self.env.clone(),
            tenant: self.tenant(),
            session_id: self.session_id(),
            owner: self.owner(),
            turn_authors: self
                .with_loaded(|l| l.session.turn_authors().to_vec())
                .unwrap_or_default(),
            attachments: self.attachments.borrow().clone(),
            validated: self.validated.borrow().clone(),
            approvals: Rc::new(ActorApprovals {
                actor: self.clone(),
                step,
            }),
            runner_calls: RunnerCallScope::new(self.runner_calls.clone(), step),
            lineage: self.lineage(),
            limits: crate::session_client::orchestration_limits(&self.env),
            children: Rc::new(ActorChildren {
                actor: self.clone(),
            }),
            parent_session: self
                .with_loaded(|l| ParentFacts {
                    access: l.meta.access,
                    provider: l.meta.header.provider.clone(),
                    model: l.meta.header.model.clone(),
                })
                .unwrap_or_default(),
        }
    }

    /// Applies a finished tool's output: attachment changes, entries before the result, the
    /// result. All synchronous, so it commits as one write. A call that no longer runs (stopped,
    /// or from before a restart) changes nothing.
    fn finish_tool(self: &Rc<Self>, step: u64, call_id: &str, output: ToolOutput) {
        let running = self
            .with_loaded(|l| l.session.is_tool_running(step, call_id))
            .unwrap_or(false);
        if !running {
            return;
        }
        self.validated.borrow_mut().extend(output.validated);
        if let Some(change) = output.change {
            let mut attachments = self.attachments.borrow_mut();
            match change {
                AttachmentChange::Attach(attachment) => attachments.push(attachment),
                AttachmentChange::Detach(name) => {
                    attachments.retain(|a| a.name() != name);
                    self.validated.borrow_mut().remove(&name);
                }
            }
            if let Ok(store) = self.store()
                && let Err(e) = store.save_attachments(&attachments)
            {
                worker::console_error!("saving attachments failed: {e}");
            }
        }
        self.with_session(|s| {
            s.handle_tool_progress(now(), step, call_id, output.entries);
            s.handle_tool_done(now(), step, call_id, output.content, output.is_error);
        });
        self.pump();
    }
}
