//! The calls a session's actor (`SessionActor`, one per session) answers: the public routes
//! under `/v1/sessions/:id` that the router decodes ([`decode_public`]), and the calls between
//! actors (a parent and its child, a fork and the session it forked, the tenant's index, a
//! chat binding, the runner hub).
//!
//! What a call needs of its caller is [`SessionCall::needs`]: the actor checks it against the
//! session's owner, creator and access (`authority::session_allows`) before it acts.

use serde::{Deserialize, Serialize};

use super::{
    CallError, Empty, Method, Streamed, Target, Upgrade, call, call_enum, decode_body,
    decode_optional_body, query_text, query_u64,
};
use crate::authority::{Access, SessionAction, ToolReaders};
use crate::environments::Attachment;
use crate::follow::FollowRequest;
use crate::orchestration::Lineage;
use crate::wire::runner::{JobEvent, ToolOutputRelay};
use crate::wire::{
    AnswerApprovalRequest, AnswerApprovalResponse, Budget, CancelRequest, CancelResponse,
    ChildLifecycle, ChildStatus, CompactRequest, CompactResponse, CreateSessionRequest,
    EnqueueRequest, EnqueueResponse, Entry, EntryPayload, ForkedFrom, GetSessionResponse,
    JobsResponse, Lane, MAX_COMPACT_INSTRUCTIONS_BYTES, PatchSessionRequest, SessionInfo,
    SessionStats, StopResponse, UsageResponse,
};

/// The session actor.
#[derive(Debug)]
pub struct Session;

impl Target for Session {
    const HOST: &'static str = "session";
}

/// Largest transcript page (`limit`), in entries.
pub const MAX_PAGE: u64 = crate::archive::MAX_PAGE as u64;

// -----------------------------------------------------------------------------------------
// Public routes

/// `GET /v1/sessions/:id`: a transcript page with the session, its queue, environments and
/// children.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Transcript {
    /// Entries after this cursor.
    pub since_cursor: u64,
    /// Only entries created after this time (unix seconds).
    pub since_time: Option<u64>,
    /// At most this many entries (1 to [`MAX_PAGE`]).
    pub limit: u64,
}
call!(Transcript => Session, "transcript", GetSessionResponse);

/// `POST /v1/sessions/:id/enqueue?lane=` (and a chat binding's message).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Enqueue {
    /// The lane (`followUp` unless the query says `steer`).
    pub lane: Lane,
    /// The message.
    pub request: EnqueueRequest,
    /// A chat binding's name for its message (its platform message id): the same message sent
    /// again after a crash is queued once. Set only between actors, never from a client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_key: Option<String>,
}
call!(Enqueue => Session, "enqueue", EnqueueResponse);

/// `POST /v1/sessions/:id/cancel`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Cancel(pub CancelRequest);
call!(Cancel => Session, "cancel", CancelResponse);

/// `POST /v1/sessions/:id/stop`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Stop;
call!(Stop => Session, "stop", StopResponse);

/// `PATCH /v1/sessions/:id` (validated: [`PatchSessionRequest::validate`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Patch(pub PatchSessionRequest);
call!(Patch => Session, "patch", SessionInfo);

/// `POST /v1/sessions/:id/compact` (instructions within their bound).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Compact(pub CompactRequest);
call!(Compact => Session, "compact", CompactResponse);

/// `GET /v1/sessions/:id/follow`: the SSE stream.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Follow {
    /// Where it starts and when it stops.
    pub request: FollowRequest,
    /// The `jti` of the credential that opened it (set by the router from the verified token
    /// only): a revocable one is re-checked while the stream is open.
    pub jti: Option<String>,
}
call!(Follow => Session, "follow", Streamed);

/// `GET /v1/sessions/:id/socket`: the session socket (a WebSocket upgrade).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Socket {
    /// Events after this cursor.
    pub after: u64,
    /// As [`Follow::jti`].
    pub jti: Option<String>,
}
call!(Socket => Session, "socket", Streamed);
impl Upgrade for Socket {}

/// `GET /v1/sessions/:id/usage`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Usage;
call!(Usage => Session, "usage", UsageResponse);

/// `GET /v1/sessions/:id/jobs`: the session's background jobs, as it last learnt of them.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Jobs;
call!(Jobs => Session, "jobs", JobsResponse);

/// `GET /v1/sessions/:id/stats`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Stats;
call!(Stats => Session, "stats", SessionStats);

/// `DELETE /v1/sessions/:id`.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Delete;
call!(Delete => Session, "delete", Deleted);

/// `POST /v1/sessions/:id/approvals/:approvalId`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AnswerApproval {
    /// The approval.
    pub approval_id: String,
    /// The decision.
    pub answer: AnswerApprovalRequest,
}
call!(AnswerApproval => Session, "answer_approval", AnswerApprovalResponse);

/// Where a deletion stands when its call is answered. (Externally tagged: an internally tagged
/// enum costs the Worker a buffering decoder.)
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub enum Deleted {
    /// Every step is done: `204`.
    Finished,
    /// Marked and hidden; the alarm finishes the steps: `202`.
    Continuing,
}

/// Decodes a public request under `/v1/sessions/:id` (`rest` is the path after the id:
/// empty, `["enqueue"]`, …) into its call, validating it: bad input is refused here, before
/// the session's actor wakes.
///
/// `last_event_id` is the request's `Last-Event-ID` header; `jti` the `jti` of the verified
/// credential (for streams and sockets, which end when it is revoked).
///
/// # Errors
/// A [`CallError`] for an unknown route or method, or input out of its bounds.
pub fn decode_public(
    method: Method,
    rest: &[&str],
    query: &[(String, String)],
    body: &[u8],
    last_event_id: Option<&str>,
    jti: Option<&str>,
) -> Result<SessionCall, CallError> {
    let jti = jti.map(str::to_string);
    let call: SessionCall = match (rest, method) {
        ([], Method::Get) => {
            let limit = query_u64(query, "limit")?.unwrap_or(MAX_PAGE);
            if limit == 0 || limit > MAX_PAGE {
                return Err(CallError::BadRequest(format!(
                    "limit must be between 1 and {MAX_PAGE}"
                )));
            }
            Transcript {
                since_cursor: query_u64(query, "sinceCursor")?.unwrap_or(0),
                since_time: query_u64(query, "sinceTime")?,
                limit,
            }
            .into()
        }
        ([], Method::Patch) => {
            let request: PatchSessionRequest = decode_body(body)?;
            request.validate().map_err(CallError::BadRequest)?;
            Patch(request).into()
        }
        ([], Method::Delete) => Delete.into(),
        (["enqueue"], Method::Post) => Enqueue {
            lane: public_lane(query_text(query, "lane").as_deref())?,
            request: decode_body(body)?,
            item_key: None,
        }
        .into(),
        (["cancel"], Method::Post) => Cancel(decode_body(body)?).into(),
        (["stop"], Method::Post) => {
            // The body says nothing; any JSON (or none) is accepted.
            if !body.iter().all(u8::is_ascii_whitespace) {
                decode_body::<serde_json::Value>(body)?;
            }
            Stop.into()
        }
        (["compact"], Method::Post) => {
            let request: CompactRequest = decode_optional_body(body)?;
            if request
                .instructions
                .as_ref()
                .is_some_and(|i| i.len() > MAX_COMPACT_INSTRUCTIONS_BYTES)
            {
                return Err(CallError::BadRequest(format!(
                    "instructions must be at most {MAX_COMPACT_INSTRUCTIONS_BYTES} bytes"
                )));
            }
            Compact(request).into()
        }
        (["follow"], Method::Get) => {
            let request = FollowRequest::parse(
                last_event_id,
                query_u64(query, "sinceCursor")?,
                query_u64(query, "sinceTime")?,
                super::query(query, "stopAfterIdle"),
                query_u64(query, "timeoutSeconds")?,
            )
            .map_err(CallError::BadRequest)?;
            Follow { request, jti }.into()
        }
        (["socket"], Method::Get) => Socket {
            after: query_u64(query, "after")?.unwrap_or(0),
            jti,
        }
        .into(),
        (["usage"], Method::Get) => Usage.into(),
        (["jobs"], Method::Get) => Jobs.into(),
        (["stats"], Method::Get) => Stats.into(),
        (["approvals", approval_id], Method::Post) => AnswerApproval {
            approval_id: (*approval_id).to_string(),
            answer: decode_body(body)?,
        }
        .into(),
        (
            []
            | [
                "enqueue" | "cancel" | "stop" | "compact" | "follow" | "socket" | "usage" | "stats"
                | "jobs",
            ]
            | ["approvals", _],
            _,
        ) => return Err(CallError::MethodNotAllowed),
        _ => return Err(CallError::UnknownRoute),
    };
    Ok(call)
}

/// The lane a person's message goes on: `followUp` unless `steer` is named (`system` is
/// internal).
///
/// # Errors
/// [`CallError::BadRequest`] for any other name.
pub fn public_lane(name: Option<&str>) -> Result<Lane, CallError> {
    match name {
        None => Ok(Lane::FollowUp),
        Some(name) => Lane::parse_public(name).ok_or_else(|| {
            CallError::BadRequest(format!("unknown lane {name:?}: use steer or followUp"))
        }),
    }
}

// -----------------------------------------------------------------------------------------
// Calls between actors

/// What the session is, without its transcript (for a fork, the tools, the router).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Info;
call!(Info => Session, "info", SessionInfo);

/// A session's tools read this session for `readers` (`read_session`, js `wuhu.sessions.get`):
/// a page as [`Transcript`] gives it, when every person the reading turn acts for may read
/// this session (`authority::ToolReaders`); otherwise not found.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReadFor {
    /// Whom the tool reads for.
    pub readers: ToolReaders,
    /// The page.
    pub page: Transcript,
}
call!(ReadFor => Session, "read_for", GetSessionResponse);

/// Creates a session (`POST /v1/sessions`, validated by the router:
/// [`CreateSessionRequest::validate`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Create(pub SessionInit);
call!(Create => Session, "create", SessionInfo);

/// Creates a child session (a parent's `spawn_session`): it is born with its lineage and
/// environments, and its task goes through the tenant's concurrency gate.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CreateChild {
    /// What any session is created with.
    pub init: SessionInit,
    /// What a child is created with besides.
    pub child: ChildInit,
}
call!(CreateChild => Session, "create_child", ChildCreated);

/// Creates a fork (`POST /v1/sessions/:id/fork`, once the person may read the session forked).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CreateFork(pub ForkInit);
call!(CreateFork => Session, "create_fork", SessionInfo);

/// Deletes a child as part of its parent's deletion: no person is checked (the parent's
/// deletion was authorised and checked the forks of the whole tree).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Dispose;
call!(Dispose => Session, "dispose", Deleted);

/// A child tells its parent what became of it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ChildEvent(pub ChildStatus);
call!(ChildEvent => Session, "child_event", Accepted);

/// A parent gives its child input (`send_to_session`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GiveChildInput(pub ChildInput);
call!(GiveChildInput => Session, "child_input", ChildAdmission);

/// A fork reads the history of the session it forked (no person is checked: the fork was
/// created by someone who could read it).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Prefix(pub PrefixRequest);
call!(Prefix => Session, "prefix", PrefixPage);

/// The runner hub tells the session a background job of its ended.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct JobEnded(pub JobEvent);
call!(JobEnded => Session, "job_event", Accepted);

/// The runner hub relays the output of a call the session waits for (`crate::tool_output`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ToolOutput(pub ToolOutputRelay);
call!(ToolOutput => Session, "tool_output", Accepted);

/// The tenant's gate granted the child a slot: it runs the input it kept.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct Start;
call!(Start => Session, "start", Empty);

/// The tenant index reconciles its gate (`wuhu_core::orchestration::Gate::reconcile`): does
/// this child still need the slot it holds?
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct SlotHeld;
call!(SlotHeld => Session, "slot_held", SlotHolder);

/// The answer to [`SlotHeld`].
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotHolder {
    /// It runs a turn or keeps input for one (`false`: idle, failed or stopped).
    pub running: bool,
}

/// The tenant's settings changed: the actor forgets the reading it keeps. Answered by any
/// actor, a deleted one too (decision 0021).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
pub struct ForgetSettings;
call!(ForgetSettings => Session, "forget_settings", Empty);

/// A chat channel's outbox gave up posting a message of this session: a notice in the
/// transcript (whoever may prompt the session may leave one).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Notice {
    /// The binding.
    pub channel: String,
    /// The outbox row's key.
    pub key: String,
    /// Why it gave up.
    pub reason: String,
}
call!(Notice => Session, "notice", Empty);

/// Whether an event was taken (`false`: it was older than what the receiver knows).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Accepted {
    /// Taken.
    pub accepted: bool,
}

/// What every new session is created with.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SessionInit {
    /// Its id (a UUID).
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Who created it.
    pub created_by: String,
    /// The provider (validated), when not the tenant's default.
    pub provider: Option<String>,
    /// The model, when not the provider's default.
    pub model: Option<String>,
    /// The system prompt, when not the default.
    pub system_prompt: Option<String>,
    /// The title (normalised).
    pub title: Option<String>,
    /// The creator's global context document.
    pub global_context: Option<GlobalContext>,
    /// The budget it starts with (`POST /v1/sessions {budget}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// Its reasoning setting (`POST /v1/sessions {reasoning}`), checked against its model
    /// when it is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<crate::llm::reasoning::Reasoning>,
    /// The chat binding whose thread it is (a child: its parent's): its guests' workspace
    /// folder is `channels/<binding>/`, and a turn in it that acts for nobody has a guest's
    /// rights (`authority::TurnRights`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
}

/// The user's global context document (`users/<sub>/context.md`) as a session starts with it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct GlobalContext {
    /// Its workspace path.
    pub path: String,
    /// Its version.
    pub version: String,
    /// Its text.
    pub content: String,
}

/// What a child session is born with besides a session's [`SessionInit`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChildInit {
    /// Where it sits in its tree.
    pub lineage: Lineage,
    /// The parent's access (a child has the same).
    pub access: Access,
    /// Environments it starts with (`environment: "inherit"`).
    pub attachments: Vec<Attachment>,
    /// Its first message, sent by its creator through the concurrency gate.
    pub task: String,
    /// Whom the task acts for: the people the parent's turn acted for when it spawned the
    /// child (empty: nobody, a turn the system started). The child's tools get no more
    /// authority than every one of them has.
    pub acting_for: Vec<String>,
    /// Entries its transcript starts with: the policy's notices of the environment to be made
    /// for it (`environment: <spec>`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<EntryPayload>,
    /// The environment to make for it (`environment: <spec>`), resolved and approved by the
    /// spawn but not made: the child has it made when it gets its gate slot, before its task
    /// runs (construct when ready, seed 002), so a spawn that never gets a slot makes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub construct: Option<Box<crate::wire::ResolveEnvironmentResponse>>,
}

/// A message for a child (`send_to_session`), through the gate when the child is settled.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChildInput {
    /// The message.
    pub content: String,
    /// Its lane.
    pub lane: Lane,
    /// Who sends it.
    pub author: String,
    /// Whom it acts for (see [`ChildInit::acting_for`]).
    pub acting_for: Vec<String>,
}

/// Where a child is after it was given input: `created` or `running` when it holds a slot,
/// `queued` when it waits for one. `cursor` orders it among the child's reports.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChildAdmission {
    /// Where it is.
    #[serde(flatten)]
    pub lifecycle: ChildLifecycle,
    /// Orders it among the child's reports.
    pub cursor: u64,
}

/// A child's answer to [`CreateChild`].
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChildCreated {
    /// The child.
    pub session: SessionInfo,
    /// Where its task is.
    pub admission: ChildAdmission,
}

/// What a fork is created with.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ForkInit {
    /// Its id.
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// Who forked.
    pub created_by: String,
    /// Its title.
    pub title: Option<String>,
    /// The session and cursor it forks at.
    pub from: ForkedFrom,
}

/// A page of a history a fork reads: entries after `since_cursor` and at most `through`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrefixRequest {
    /// Entries after this cursor.
    pub since_cursor: u64,
    /// At most this many (1 to [`MAX_PAGE`]).
    pub limit: u64,
    /// The last cursor of the history.
    pub through: u64,
}

/// A page of a history: entries after `since_cursor` and at most `through`, contiguous.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrefixPage {
    /// The entries.
    pub entries: Vec<Entry>,
    /// Where the next page starts, while the history goes on.
    pub next_cursor: Option<u64>,
}

call_enum! {
    /// Every call a session's actor answers.
    pub enum SessionCall for Session {
        Transcript(Transcript),
        Enqueue(Enqueue),
        Cancel(Cancel),
        Stop(Stop),
        Patch(Patch),
        Compact(Compact),
        Follow(Follow),
        Socket(Socket),
        Usage(Usage),
        Jobs(Jobs),
        Stats(Stats),
        Delete(Delete),
        AnswerApproval(AnswerApproval),
        Info(Info),
        ReadFor(ReadFor),
        Create(Create),
        CreateChild(CreateChild),
        CreateFork(CreateFork),
        Dispose(Dispose),
        ChildEvent(ChildEvent),
        GiveChildInput(GiveChildInput),
        Prefix(Prefix),
        JobEnded(JobEnded),
        ToolOutput(ToolOutput),
        Start(Start),
        SlotHeld(SlotHeld),
        ForgetSettings(ForgetSettings),
        Notice(Notice),
    }
}

/// What a call needs of its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Needs {
    /// Nothing of a person: only actors of the tenant send it (the router never decodes it from
    /// a client's request). Answered before the session is loaded, or without a person.
    Internal,
    /// A person who may do each of these to the session (reading it is always among them: a
    /// session the caller may not read does not exist for them).
    Person(Vec<SessionAction<'static>>),
}

impl SessionCall {
    /// What the call needs of its caller. A person's call needs at least
    /// [`SessionAction::Read`] (first, so a hidden session answers 404 for every call); the
    /// rest depend on the call (a `PATCH` on the fields it changes). Cancelling needs more
    /// once the item is known (`SessionAction::CancelItem`), deleting a marked session is
    /// checked against the mark: the actor checks those.
    pub fn needs(&self) -> Needs {
        use SessionAction as A;
        let person = |more: &[A<'static>]| {
            let mut actions = vec![A::Read];
            actions.extend_from_slice(more);
            Needs::Person(actions)
        };
        match self {
            SessionCall::Transcript(_)
            | SessionCall::Follow(_)
            | SessionCall::Socket(_)
            | SessionCall::Usage(_)
            | SessionCall::Jobs(_)
            | SessionCall::Stats(_)
            | SessionCall::Info(_)
            | SessionCall::Cancel(_)
            | SessionCall::AnswerApproval(_) => person(&[]),
            SessionCall::Enqueue(_) | SessionCall::Compact(_) | SessionCall::Notice(_) => {
                person(&[A::Prompt])
            }
            SessionCall::Stop(_) => person(&[A::Stop]),
            SessionCall::Delete(_) => person(&[A::Delete]),
            SessionCall::Patch(Patch(patch)) => {
                let mut more = Vec::new();
                if patch.title.is_some() {
                    more.push(A::Rename);
                }
                if patch.access.is_some() {
                    more.push(A::ChangeAccess);
                }
                // Limits on spending are for those who may rename the session.
                if patch.budget.is_some() {
                    more.push(A::Rename);
                }
                // Whoever may prompt may choose the model the prompts go to, and how much it
                // reasons (as each message may, for its turn).
                if patch.provider.is_some() || patch.model.is_some() || patch.reasoning.is_some() {
                    more.push(A::Prompt);
                }
                person(&more)
            }
            SessionCall::Create(_)
            | SessionCall::CreateChild(_)
            | SessionCall::CreateFork(_)
            | SessionCall::Dispose(_)
            | SessionCall::ReadFor(_)
            | SessionCall::ChildEvent(_)
            | SessionCall::GiveChildInput(_)
            | SessionCall::Prefix(_)
            | SessionCall::JobEnded(_)
            | SessionCall::ToolOutput(_)
            | SessionCall::Start(_)
            | SessionCall::SlotHeld(_)
            | SessionCall::ForgetSettings(_) => Needs::Internal,
        }
    }
}

impl CreateSessionRequest {
    /// Checks a creation request and gives the session's [`SessionInit`] fields it sets: the
    /// provider (one of `llm::PROVIDERS`, when named), the model (1 to `MAX_MODEL_CHARS`
    /// characters), the title (normalised; one with nothing visible is no title), the budget.
    ///
    /// # Errors
    /// A message for a 400.
    pub fn validate(&self) -> Result<ValidCreate, String> {
        if let Some(provider) = &self.provider
            && !crate::llm::PROVIDERS.contains(&provider.as_str())
        {
            return Err(format!(
                "unknown provider {provider:?}: use one of {}",
                crate::llm::PROVIDERS.map(|p| format!("{p:?}")).join(", ")
            ));
        }
        if let Some(model) = &self.model
            && (model.trim().is_empty() || model.chars().count() > crate::wire::MAX_MODEL_CHARS)
        {
            return Err(format!(
                "model must be 1 to {} characters",
                crate::wire::MAX_MODEL_CHARS
            ));
        }
        // A title with nothing visible in it is no title.
        let title = match self.title.as_deref().map(crate::text::clean_title) {
            Some(t) if !t.is_empty() => Some(crate::wire::normalize_title(&t)?),
            _ => None,
        };
        if let Some(budget) = &self.budget {
            budget.validate()?;
        }
        Ok(ValidCreate {
            provider: self.provider.clone(),
            model: self.model.as_ref().map(|m| m.trim().to_string()),
            title,
        })
    }
}

/// The fields of a [`CreateSessionRequest`] once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidCreate {
    /// The provider, if named.
    pub provider: Option<String>,
    /// The model, if named.
    pub model: Option<String>,
    /// The title, if any.
    pub title: Option<String>,
}

#[cfg(test)]
mod tests;
