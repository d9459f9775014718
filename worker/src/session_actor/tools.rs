//! Tool calls as actor tasks: the complete context a call gets, and applying its output.
//! The tools themselves (`crate::builtin_tools`, `crate::environment_tools`, `crate::js_tool`)
//! never see the actor.

use std::rc::Rc;

use wuhu_core::authority::TurnRights;
use wuhu_core::tools::names;
use wuhu_core::wire::{Header, ToolCall};

use super::approvals::ActorApprovals;
use super::children::ActorChildren;
use super::jobs::ActorJobs;
use super::{Actor, now};
use crate::runner_calls::RunnerCallScope;
use crate::tool_context::{AttachmentChange, ParentFacts, SessionPlace, ToolContext, ToolOutput};
use crate::{builtin_tools, environment_tools, mcp_client, orchestration_tools, policy_gate};

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
    let context = actor.tool_context(step, &call.id);
    // Every call passes the policy first (decision 0038). The tools that run on a runner, and
    // `request_environment`, check it themselves: their runner and cost are known only there;
    // so does `mcp_call`, whose server's host is known only there.
    let checked = if environment_tools::checks_policy_itself(&call)
        || mcp_client::checks_policy_itself(&call)
    {
        Ok(Default::default())
    } else {
        let facts = wuhu_core::policy::Call {
            tool: &call.name,
            paths: policy_gate::paths_of(&call.arguments),
            ..Default::default()
        };
        let details = policy_gate::change_details(&call.name, &call.arguments);
        policy_gate::check(&context, policy_gate::CALL_PART, &facts, None, details).await
    };
    let output = match checked {
        Err(refused) => refused,
        Ok(decided) => {
            let mut output = if call.name == names::SET_MODEL {
                ToolOutput::text(
                    crate::model_tool::set_model(&context, &call.arguments).map(|s| s.text),
                )
            } else if environment_tools::handles(&call) {
                environment_tools::execute(&context, &call).await
            } else if mcp_client::handles(&call) {
                mcp_client::execute(&context, &call).await
            } else if orchestration_tools::handles(&call) {
                ToolOutput::text(orchestration_tools::execute(&context, &call).await)
            } else {
                builtin_tools::execute(&context, &call).await
            };
            output.entries.splice(0..0, decided.entries);
            output.entries.extend(context.decided.take());
            output
        }
    };
    let model_switch = context.model_switch.take();
    let switched = actor.finish_tool(step, &call.id, output, model_switch);
    if switched {
        // The list shows each session's model.
        if let Ok(info) = actor.info() {
            let _ = crate::tenant_index::upsert(&actor.env, &actor.tenant(), &info).await;
        }
    }
}

/// The live output of a tool the Worker runs itself: relayed to followers like a runner call's
/// (the same bounded tails, the same masking), ended when the call's context goes (finished,
/// or dropped by a stop).
/// A tool call's request log: written by the actor like its step's provider requests.
struct ActorRequestLog {
    actor: Rc<Actor>,
    step: u64,
    days: u32,
}

impl crate::tool_context::RequestLog for ActorRequestLog {
    fn record(&self, exchange: wuhu_core::llm::request_log::Exchange) {
        let (actor, step, days) = (self.actor.clone(), self.step, self.days);
        wasm_bindgen_futures::spawn_local(async move {
            let masker = actor.masker();
            super::inference::log_request(&actor, step, &exchange, days, &masker).await;
        });
    }
}

struct ActorLive {
    actor: Rc<Actor>,
    call_id: String,
    started: std::cell::Cell<bool>,
}

impl crate::tool_context::LiveOutput for ActorLive {
    fn push(&self, text: &str) {
        let calls = &self.actor.in_flight.runner_calls;
        if !self.started.replace(true) {
            calls.start_local_output(&self.call_id, &self.actor.masker());
        }
        if let Some(event) = calls.local_output(&self.call_id, text) {
            self.actor.broadcast(event);
        }
    }
}

impl Drop for ActorLive {
    fn drop(&mut self) {
        if self.started.get() {
            self.actor
                .in_flight
                .runner_calls
                .end_local_output(&self.call_id);
        }
    }
}

impl Actor {
    /// The complete context a tool call gets.
    fn tool_context(self: &Rc<Self>, step: u64, call_id: &str) -> ToolContext {
        let owner = self.owner();
        let created_by = self
            .with_loaded(|l| l.meta.created_by.clone())
            .unwrap_or_default();
        let acting_for = self
            .with_loaded(|l| l.session.turn_authors().to_vec())
            .unwrap_or_default();
        let channel = self.with_loaded(|l| l.meta.channel.clone()).flatten();
        let rights = TurnRights::of_turn(&acting_for, &owner, &created_by, channel.as_deref());
        let session = SessionPlace {
            tenant: self.tenant(),
            session_id: self.session_id(),
            owner: owner.clone(),
            created_by,
            channel,
            lineage: self.lineage(),
            parent_session: self
                .with_loaded(|l| ParentFacts {
                    access: l.meta.access,
                    provider: l.meta.header.provider.clone(),
                    model: l.meta.header.model.clone(),
                })
                .unwrap_or_default(),
        };
        ToolContext {
            env: self.env.clone(),
            session,
            acting_for,
            rights,
            attachments: self.environments.attachments.borrow().clone(),
            validated: self.environments.validated.borrow().clone(),
            approvals: Rc::new(ActorApprovals {
                actor: self.clone(),
                step,
                call_id: call_id.to_string(),
            }),
            runner_calls: RunnerCallScope::new(self.in_flight.runner_calls.clone(), step),
            limits: crate::session_client::orchestration_limits(&self.env),
            children: Rc::new(ActorChildren {
                actor: self.clone(),
            }),
            jobs: Rc::new(ActorJobs {
                actor: self.clone(),
            }),
            models: self.model_rule(),
            model_switch: Default::default(),
            secrets: self
                .tenant_settings
                .last_settings
                .borrow()
                .as_ref()
                .map(|s| s.secrets.clone())
                .unwrap_or_else(|| Rc::new([])),
            masker: self.masker(),
            policy: self
                .tenant_settings
                .last_settings
                .borrow()
                .as_ref()
                .map(|s| s.policy.clone())
                .unwrap_or_default(),
            call_id: call_id.to_string(),
            decided: Default::default(),
            live: Rc::new(ActorLive {
                actor: self.clone(),
                call_id: call_id.to_string(),
                started: std::cell::Cell::new(false),
            }),
            request_log: self
                .tenant_settings
                .last_settings
                .borrow()
                .as_ref()
                .and_then(|s| s.log_days)
                .map(|days| {
                    Rc::new(ActorRequestLog {
                        actor: self.clone(),
                        step,
                        days,
                    }) as Rc<dyn crate::tool_context::RequestLog>
                }),
        }
    }

    /// Applies a finished tool's output: attachment changes, a model switch, entries before
    /// the result, the result. All synchronous, so it commits as one write. A call that no
    /// longer runs (stopped, or from before a restart) changes nothing. Returns whether the
    /// model was switched.
    fn finish_tool(
        self: &Rc<Self>,
        step: u64,
        call_id: &str,
        output: ToolOutput,
        model_switch: Option<(String, String)>,
    ) -> bool {
        let running = self
            .with_loaded(|l| l.session.is_tool_running(step, call_id))
            .unwrap_or(false);
        if !running {
            return false;
        }
        let switched =
            model_switch.and_then(|(provider, model)| self.switch_model(provider, model));
        if let Some((from, to)) = &switched {
            let by = self
                .with_loaded(|l| l.session.turn_author().map(str::to_string))
                .flatten()
                .unwrap_or_default();
            self.with_session(|s| {
                s.handle_model_changed(now(), from, to, &by);
                if from.reasoning != to.reasoning {
                    let why = format!(
                        "The model {} ({}) takes no such setting, so the switch removed it.",
                        to.model, to.provider
                    );
                    s.handle_reasoning_changed(
                        now(),
                        from.reasoning,
                        to.reasoning,
                        &by,
                        Some(&why),
                    );
                }
            });
        }
        let validated_changed = !output.validated.is_empty() || output.change.is_some();
        self.environments
            .validated
            .borrow_mut()
            .extend(output.validated);
        if let Some(change) = output.change {
            let mut attachments = self.environments.attachments.borrow_mut();
            match change {
                AttachmentChange::Attach(attachment) => {
                    self.record_workspace_host(&attachment);
                    attachments.push(*attachment);
                }
                AttachmentChange::Detach(name) => {
                    attachments.retain(|a| a.name() != name);
                    self.environments.validated.borrow_mut().remove(&name);
                }
            }
            if let Ok(store) = self.store()
                && let Err(e) = store.save_attachments(&attachments)
            {
                worker::console_error!("saving attachments failed: {e}");
            }
        }
        if validated_changed {
            self.save_validated();
        }
        // Nothing a tool returns is stored or sent before its secrets are masked.
        let masker = self.masker();
        let entries: Vec<_> = output
            .entries
            .into_iter()
            .map(|e| crate::secrets::mask_entry(&masker, e))
            .collect();
        let content = masker.mask(&output.content).into_owned();
        self.with_session(|s| {
            s.handle_tool_progress(now(), step, call_id, entries);
            s.handle_tool_done_with_blobs(
                now(),
                step,
                call_id,
                content,
                output.is_error,
                output.blobs,
            );
        });
        self.pump();
        switched.is_some()
    }

    /// The masker of the tenant's secrets as the latest settings reading has them; before any
    /// reading, the detector alone.
    pub(super) fn masker(&self) -> Rc<wuhu_core::masking::Masker> {
        match self.tenant_settings.last_settings.borrow().as_ref() {
            Some(settings) => settings.masker(&self.env, &self.tenant()),
            None => Rc::new(wuhu_core::masking::Masker::default()),
        }
    }

    /// Stores the session's new provider and model (memory changes only after storage did).
    /// Returns the headers before and after, or `None` when nothing changed or storing failed.
    fn switch_model(&self, provider: String, model: String) -> Option<(Header, Header)> {
        let mut loaded = self.loaded.borrow_mut();
        let loaded = loaded.as_mut()?;
        let from = loaded.meta.header.clone();
        if from.provider == provider && from.model == model {
            return None;
        }
        let mut meta = loaded.meta.clone();
        meta.header.provider = provider;
        meta.header.model = model;
        // A reasoning setting the new model cannot take is removed with the switch (and told),
        // as a `PATCH` would have to (`reasoning: null`): none is sent that the model refuses.
        if let Some(reasoning) = &meta.header.reasoning {
            let table = self
                .tenant_settings
                .last_settings
                .borrow()
                .as_ref()
                .map(|s| s.models.clone());
            let fits = match table {
                Some(table) => wuhu_core::llm::reasoning::plan(
                    &table,
                    &meta.header.provider,
                    &meta.header.model,
                    reasoning,
                ),
                None => wuhu_core::llm::reasoning::plan(
                    &wuhu_core::llm::models::ModelTable::builtin(),
                    &meta.header.provider,
                    &meta.header.model,
                    reasoning,
                ),
            };
            if fits.is_err() {
                meta.header.reasoning = None;
            }
        }
        meta.updated_at = now().unix_seconds();
        let saved = match self.store() {
            Ok(store) => store.save_meta(&meta).map_err(|e| e.to_string()),
            Err(e) => Err(e.message),
        };
        if let Err(e) = saved {
            worker::console_error!("saving the model switch failed: {e}");
            return None;
        }
        let to = meta.header.clone();
        loaded.meta = meta;
        Some((from, to))
    }
}
