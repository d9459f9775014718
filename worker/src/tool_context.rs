//! What a tool call gets and what it gives back. Tools (`builtin_tools`, `environment_tools`,
//! `js_tool`) see only these types, never the session actor itself: the actor builds a
//! [`ToolContext`] for each call and applies the [`ToolOutput`] (`session_actor::tools`).
//! While a call runs, a tool reaches the actor only through three narrow handles the context
//! carries: [`ApprovalGate`] (ask a person and wait), [`Children`] (the session's children as
//! it knows them, and their changes) and [`Jobs`] (its background jobs).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use futures::future::LocalBoxFuture;
use serde_json::Value;
use worker::Env;
use wuhu_core::approvals::{Action, Approver, Outcome, Target};
use wuhu_core::authority::{Access, Role, ToolReaders, TurnRights, WorkspaceWriter};
use wuhu_core::environments::Attachment;
use wuhu_core::llm::choice::{self, UsdLimits};
use wuhu_core::llm::models::ModelTable;
use wuhu_core::orchestration::{Limits, Lineage};
use wuhu_core::wire::{ChildStatus, EntryPayload};

use crate::auth::Identity;
use crate::runner_calls::RunnerCallScope;

/// Everything a tool may use: facts copied when the call starts, and the three handles
/// (`approvals`, `children`, `jobs`) through which it reaches back into the session.
pub(crate) struct ToolContext {
    pub(crate) env: Env,
    /// Whom the current turn acts for (`Session::turn_authors`: the union of its messages'
    /// acting-for sets; empty: nobody, a turn the system started). Authority travels with it:
    /// a call that reaches the local runner of anyone else waits for that runner's owner,
    /// other sessions are read as every one of them may read them, a child's task and a
    /// message to a child act for them too.
    pub(crate) acting_for: Vec<String>,
    /// What the turn may reach (`TurnRights::of_turn`): a guest's turn gets no runner, no
    /// egress and the workspace only under its binding's folder.
    pub(crate) rights: TurnRights,
    /// Environments attached when the call started.
    pub(crate) attachments: Vec<Attachment>,
    /// Runner connection epochs on which each environment's snapshot was validated.
    pub(crate) validated: HashMap<String, u64>,
    /// Where a tool asks a person for approval.
    pub(crate) approvals: Rc<dyn ApprovalGate>,
    /// Where runner calls are recorded, so stopping the step cancels them on the runner.
    pub(crate) runner_calls: RunnerCallScope,
    /// The configured orchestration limits.
    pub(crate) limits: Limits,
    /// The session's children as it knows them.
    pub(crate) children: Rc<dyn Children>,
    /// The session's background jobs.
    pub(crate) jobs: Rc<dyn Jobs>,
    /// What a model the call would switch to, or give a child, is checked against.
    pub(crate) models: ModelRule,
    /// The provider and model `set_model` (or js `wuhu.session.setModel`) asked for: the actor
    /// switches when the call finishes.
    pub(crate) model_switch: RefCell<Option<(String, String)>>,
    /// The session the call is made in: who it belongs to and where it sits.
    pub(crate) session: SessionPlace,
    /// The tenant's secrets, sealed, as the step's settings reading had them: what the call's
    /// environment may get (`wuhu_core::secrets::choose`).
    pub(crate) secrets: std::rc::Rc<[wuhu_core::secrets::SealedSecret]>,
    /// Their masker (and the detector): what a tool hands a script is masked with it.
    pub(crate) masker: std::rc::Rc<wuhu_core::masking::Masker>,
    /// The policies of the step's settings reading (`crate::policy_gate`).
    pub(crate) policy: Rc<crate::policy_book::PolicyBook>,
    /// The tool call this context serves (named by its policy decisions).
    pub(crate) call_id: String,
    /// Policy decisions made while the tool ran (a `js` script's fetches), shown before its
    /// result.
    pub(crate) decided: RefCell<Vec<EntryPayload>>,
    /// Where a tool the Worker runs itself shows output while it runs (an MCP server's
    /// progress), as a runner call's live output is shown.
    pub(crate) live: Rc<dyn LiveOutput>,
    /// The tenant's request logs, when it keeps them.
    pub(crate) request_log: Option<Rc<dyn RequestLog>>,
}

/// The live output of the call a context serves (`session_actor::tools`): shown to followers,
/// never stored, masked (`wuhu_core::tool_output`).
pub(crate) trait LiveOutput {
    /// More text.
    fn push(&self, text: &str);
}

/// The tenant's request logs (`crate::llm_logs`), for a call whose tenant keeps them: what a
/// tool sends to another service (an MCP server) is recorded there like a provider request,
/// redacted the same way. Writing never fails the call.
pub(crate) trait RequestLog {
    /// Records one exchange (in the background).
    fn record(&self, exchange: wuhu_core::llm::request_log::Exchange);
}

/// The session a tool call is made in: its tenant and id, whose it is, the chat thread it
/// belongs to, and its place in its tree.
pub(crate) struct SessionPlace {
    pub(crate) tenant: String,
    pub(crate) session_id: String,
    /// The session's owner (its first prompter, its creator until then): runners are chosen,
    /// other sessions and workspace documents are seen, and a definition's
    /// `"approval":"ask"` waits, on their behalf.
    pub(crate) owner: String,
    /// The session's creator (with `owner` and the access: who may do what to it).
    pub(crate) created_by: String,
    /// The chat binding whose thread the session is (or whose thread's session spawned it).
    pub(crate) channel: Option<String>,
    /// Where the session sits in its tree (the spawn tools' recursion guard).
    pub(crate) lineage: Lineage,
    /// What a child inherits from this session.
    pub(crate) parent_session: ParentFacts,
}

/// What a tool checks a model it would switch to (or give a child) against.
#[derive(Clone, Default)]
pub(crate) struct ModelRule {
    /// Whether the server allows `fake`.
    pub(crate) fake_enabled: bool,
    /// The USD limits on the session's requests when the call started.
    pub(crate) limits: UsdLimits,
    /// The model table the step read (`None`: the built-in table).
    pub(crate) table: Option<Rc<ModelTable>>,
}

impl ModelRule {
    /// Checks `model` on `provider`: the tool error when it may not be used.
    pub(crate) fn check(&self, provider: &str, model: &str) -> Result<(), String> {
        choice::check_provider(provider, self.fake_enabled).map_err(|e| e.to_string())?;
        let builtin;
        let table = match &self.table {
            Some(table) => &**table,
            None => {
                builtin = ModelTable::builtin();
                &builtin
            }
        };
        choice::check_priced(table, provider, model, self.limits).map_err(|e| e.to_string())
    }
}

/// What a child inherits from the session that spawns it.
#[derive(Clone, Default)]
pub(crate) struct ParentFacts {
    pub(crate) access: Access,
    pub(crate) provider: String,
    pub(crate) model: String,
}

/// The session's children (`session_actor::children`): what the spawn tools read and record.
pub(crate) trait Children {
    /// Every child, in spawn order, as last heard of.
    fn list(&self) -> Vec<ChildStatus>;

    /// Records what is now known of a child (kept only when newer than what is recorded),
    /// and shows it to followers.
    fn record(&self, status: ChildStatus) -> Result<(), String>;
}

/// The session's background jobs (`session_actor::jobs`): what `bash {background: true}`,
/// `job_status` and `job_kill` read and record.
pub(crate) trait Jobs {
    /// The job `id`, if this session started it (and still remembers it).
    fn get(&self, id: &str) -> Option<wuhu_core::jobs::JobRecord>;

    /// How many of its jobs run.
    fn running(&self) -> usize;

    /// Records a job the session just started; its poll begins.
    fn record(&self, record: wuhu_core::jobs::JobRecord) -> Result<(), String>;
}

impl ToolContext {
    /// Whom the session's tools read other sessions for: what every person the turn acts for
    /// may read, never more (`authority::ToolReaders`).
    pub(crate) fn readers(&self) -> ToolReaders {
        ToolReaders::of_turn(&self.session.session_id, &self.acting_for)
    }

    /// The session's owner, as a member: who acts on the session's own children (stopping
    /// one), which the session controls whoever prompts it.
    pub(crate) fn owner_identity(&self) -> Identity {
        Identity {
            sub: self.session.owner.clone(),
            tenant: self.session.tenant.clone(),
            role: Role::Member,
            runner_kind: None,
        }
    }

    /// Who the session's tools write the workspace as (see `WorkspaceWriter::SessionTool`).
    pub(crate) fn workspace_writer(&self) -> WorkspaceWriter<'_> {
        WorkspaceWriter::SessionTool {
            owner: &self.session.owner,
            turn_authors: &self.acting_for,
            rights: &self.rights,
        }
    }
}

/// What a tool changes in the session's attachments.
pub(crate) enum AttachmentChange {
    Attach(Box<Attachment>),
    Detach(String),
}

/// A tool's outcome.
pub(crate) struct ToolOutput {
    pub(crate) content: String,
    pub(crate) is_error: bool,
    /// Shown before the result (notices, AGENTS.md).
    pub(crate) entries: Vec<EntryPayload>,
    pub(crate) change: Option<AttachmentChange>,
    /// Runner connection epochs whose snapshots were validated, by environment name.
    pub(crate) validated: HashMap<String, u64>,
    /// Blobs the result refers to (checked against storage).
    pub(crate) blobs: Vec<wuhu_core::wire::BlobRef>,
}

impl ToolOutput {
    pub(crate) fn text(result: Result<String, String>) -> ToolOutput {
        let (content, is_error) = match result {
            Ok(text) => (text, false),
            Err(text) => (text, true),
        };
        ToolOutput {
            content,
            is_error,
            entries: Vec::new(),
            change: None,
            validated: HashMap::new(),
            blobs: Vec::new(),
        }
    }

    /// The text of a tool that may attach blobs (an image it read or got), with them.
    pub(crate) fn with_blobs(
        result: Result<String, String>,
        blobs: Vec<wuhu_core::wire::BlobRef>,
    ) -> ToolOutput {
        ToolOutput {
            blobs,
            ..ToolOutput::text(result)
        }
    }

    /// This output, ended by `error` (entries gathered so far are kept).
    pub(crate) fn refused(mut self, error: String) -> ToolOutput {
        self.content = error;
        self.is_error = true;
        self
    }
}

/// What a tool asks the approval gate for.
pub(crate) struct Ask<'a> {
    pub(crate) approver: Approver,
    /// Whom the call acts for (the rule decided on it): the request's `requestedBy`, and what
    /// `approve_session` covers.
    pub(crate) turn_authors: &'a [String],
    /// Where the call runs; `None` for a call that reaches no runner (a policy's ask about a
    /// `js` fetch or a child session).
    pub(crate) target: Option<Target<'a>>,
    pub(crate) action: Action<'a>,
    /// Fields of the request entry (environment, tool, runner, …); the gate adds the rest.
    pub(crate) data: Value,
    /// The rule an `always` answer adds to the approver's policy (a policy's ask only).
    pub(crate) always: Option<wuhu_core::policy::RuleDocument>,
    /// Whether a policy rule asks (its `approve_session` then stops that rule's person asking).
    pub(crate) policy: bool,
}

/// Where a tool call waits for a person's decision (the session actor's approvals).
pub(crate) trait ApprovalGate {
    /// The `approve_session` answers of this session that have not expired.
    fn grants(&self) -> Vec<wuhu_core::approvals::Grant>;

    /// Shows the request (with the tool call the gate serves) and waits for its ending. `part`
    /// tells several approvals of one call apart (`""`: the call's own action); a call that
    /// runs again after a restart finds the approval of the same part. All storage work
    /// happens before the returned future is first polled.
    fn request(&self, part: &str, ask: Ask<'_>) -> LocalBoxFuture<'static, Outcome>;
}
