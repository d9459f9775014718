//! Approvals: when a tool call waits for a person, who may answer, and how the wait ends.
//!
//! * **Who must approve** ([`required_approver`]): a call that runs on (or attaches) an
//!   environment served by a **local runner** whose owner is not among the current turn's
//!   authors waits for that runner owner ([`Approver::RunnerOwner`]), whatever the
//!   definition's `approval` says, unless a [`Grant`] of the owner covers the turn. Otherwise a
//!   definition with `"approval":"ask"` waits for the session's owner
//!   ([`Approver::SessionOwner`]) before attaching. Everything else runs at once.
//! * **Who may answer** ([`answer`]): the approver or an admin of the tenant; anyone else is
//!   [`AnswerError::Forbidden`]. `approve_session` is only an answer to a runner owner's
//!   approval: it approves, and gives the session a [`Grant`] ([`session_grant`]) that also
//!   approves the owner's other pending approvals it covers ([`covered_by`]).
//! * **What `approve_session` covers** ([`Grant::covers`]): the people the approved request
//!   acted for (its `requestedBy`), never anyone else: a later turn that acts for someone
//!   outside that set (another member of a group chat, a newcomer to a chat thread) asks again.
//!   It lasts [`grant_secs`] (var `WUHU_APPROVE_SESSION_SECONDS`, default one hour), and it is
//!   refused for a request that acts for a guest (a chat user no admin mapped, or the `*` of an
//!   overflowing set: [`AnswerError::SessionApprovalForGuests`]): a blanket yes to whoever
//!   writes in a thread is exactly what the owner cannot judge.
//! * **How the wait ends**: an answer, or expiry after the configured timeout
//!   ([`timeout_secs`], var `WUHU_APPROVAL_TIMEOUT_SECONDS`, default one hour), or withdrawal
//!   (the session stopped, the call no longer runs). Each ending that is not an approval is a
//!   tool error the agent sees ([`outcome_error`]). A session holds at most
//!   [`MAX_PENDING_PER_SESSION`] pending approvals ([`admit`]).
//!
//! Pure: the host supplies `now`, stores approvals and routes answers.

use serde::{Deserialize, Serialize};

pub use crate::authority::Approver;
use crate::authority::{Principal, may_answer_approval, runner_owner_must_approve};
use crate::session::Millis;
use crate::wire::runner::RunnerKind;
use crate::wire::{ApprovalPolicy, Entry, EntryPayload, custom_types};

/// Default time an approval waits for its answer, in seconds: one hour.
pub const DEFAULT_TIMEOUT_SECS: u64 = 3600;
/// Longest configurable wait, in seconds: seven days.
pub const MAX_TIMEOUT_SECS: u64 = 7 * 86_400;
/// Most approvals one session has pending at once. A call that would ask for one more fails
/// at once with a tool error: one prompt cannot pile up unbounded requests on someone.
pub const MAX_PENDING_PER_SESSION: usize = 16;
/// How many answered (or expired, or withdrawn) approvals a session remembers, so answering
/// one of them again is `409` rather than `404`.
pub const REMEMBERED_ENDED: usize = 256;

/// Default time an `approve_session` answer lasts, in seconds: one hour.
pub const DEFAULT_GRANT_SECS: u64 = 3600;
/// Most grants one session keeps; a further one replaces the one that ends first.
pub const MAX_GRANTS_PER_SESSION: usize = 64;

/// How long `approve_session` lasts, as `WUHU_APPROVE_SESSION_SECONDS` configures it (unset:
/// [`DEFAULT_GRANT_SECS`]).
///
/// # Errors
/// A message naming the variable when it is not a whole number of seconds in
/// `1..=`[`MAX_TIMEOUT_SECS`].
pub fn grant_secs(var: Option<&str>) -> Result<u64, String> {
    let Some(text) = var.map(str::trim) else {
        return Ok(DEFAULT_GRANT_SECS);
    };
    match text.parse::<u64>() {
        Ok(secs) if (1..=MAX_TIMEOUT_SECS).contains(&secs) => Ok(secs),
        _ => Err(format!(
            "WUHU_APPROVE_SESSION_SECONDS must be a whole number of seconds from 1 to {MAX_TIMEOUT_SECS}, not {text:?}"
        )),
    }
}

/// What an `approve_session` stops asking about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GrantScope {
    /// A runner owner's machine ([`required_approver`]).
    #[default]
    Machine,
    /// The policy's asks addressed to the person who gave it (decision 0038): a tenant rule's
    /// to the session's owner, a user's rule's to that user.
    Policy,
}

impl GrantScope {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            GrantScope::Machine => "machine",
            GrantScope::Policy => "policy",
        }
    }

    /// Parses the stored name.
    pub fn parse(text: &str) -> Option<GrantScope> {
        match text {
            "machine" => Some(GrantScope::Machine),
            "policy" => Some(GrantScope::Policy),
            _ => None,
        }
    }
}

/// An `approve_session`: in this session, for turns acting for `covers` (or fewer of them),
/// until `expires_at`, a runner owner's machine is reached without asking
/// ([`GrantScope::Machine`]), or the policy's asks to its giver are answered
/// ([`GrantScope::Policy`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// What it covers.
    pub scope: GrantScope,
    /// The person who gave it (the runner owner, for a machine).
    pub runner_owner: String,
    /// The people the approved request acted for (its `requestedBy`), sorted, without repeats.
    /// Empty: a request that acted for nobody (the system lane), which covers only such turns.
    pub covers: Vec<String>,
    /// When it ends.
    pub expires_at: Millis,
}

impl Grant {
    /// Whether it lets a turn acting for `turn` reach `runner_owner`'s machine at `now`: the
    /// same owner, not expired, and every person of the turn among those it covers (a turn
    /// for nobody only by a grant given to one; a guest or `*` never).
    pub fn covers(&self, runner_owner: &str, turn: &[String], now: Millis) -> bool {
        if self.runner_owner != runner_owner || now >= self.expires_at {
            return false;
        }
        if turn.is_empty() {
            return self.covers.is_empty();
        }
        turn.iter()
            .all(|p| !crate::authority::is_guest(p) && self.covers.contains(p))
    }
}

/// The grants an accepted `answer` to `approver` gives, for a request (a policy's ask when
/// `policy_ask`) that acted for `requested_by`, answered at `now`: none unless it is
/// `approve_session`; a runner owner's machine for a runner owner; the policy's asks to the
/// approver for a policy's ask (a runner owner answering one about their own machine gives
/// both).
pub fn session_grants(
    approver: &Approver,
    answer: Answer,
    requested_by: &[String],
    policy_ask: bool,
    now: Millis,
    grant_secs: u64,
) -> Vec<Grant> {
    if answer != Answer::ApproveSession {
        return Vec::new();
    }
    let mut covers = requested_by.to_vec();
    covers.sort();
    covers.dedup();
    let grant = |scope: GrantScope, sub: &str| Grant {
        scope,
        runner_owner: sub.to_string(),
        covers: covers.clone(),
        expires_at: expires_at(now, grant_secs),
    };
    let mut grants = Vec::new();
    if let Approver::RunnerOwner(owner) = approver {
        grants.push(grant(GrantScope::Machine, owner));
    }
    if policy_ask {
        let (Approver::RunnerOwner(sub) | Approver::SessionOwner(sub)) = approver;
        grants.push(grant(GrantScope::Policy, sub));
    }
    grants
}

/// Who must answer a policy rule's `ask` (`crate::policy::Verdict`): the session's owner for a
/// tenant rule, the rule's user (as the runner's owner) for their own.
pub fn policy_approver(rule: &crate::policy::RuleRef, session_owner: &str) -> Approver {
    match &rule.source {
        crate::policy::Source::Tenant => Approver::SessionOwner(session_owner.to_string()),
        crate::policy::Source::User(sub) => Approver::RunnerOwner(sub.clone()),
    }
}

/// Whether a policy's ask to `approver` is answered already for a turn acting for `turn`: by a
/// policy grant of that person, or (a runner owner's ask) by their machine grant.
pub fn policy_ask_covered(
    approver: &Approver,
    grants: &[Grant],
    turn: &[String],
    now: Millis,
) -> bool {
    grants.iter().any(|g| match (g.scope, approver) {
        (GrantScope::Policy, Approver::RunnerOwner(sub) | Approver::SessionOwner(sub))
        | (GrantScope::Machine, Approver::RunnerOwner(sub)) => g.covers(sub, turn, now),
        (GrantScope::Machine, Approver::SessionOwner(_)) => false,
    })
}

/// The wait configured by `WUHU_APPROVAL_TIMEOUT_SECONDS` (unset: [`DEFAULT_TIMEOUT_SECS`]).
///
/// # Errors
/// A message naming the variable when it is not a whole number of seconds in
/// `1..=`[`MAX_TIMEOUT_SECS`].
pub fn timeout_secs(var: Option<&str>) -> Result<u64, String> {
    let Some(text) = var.map(str::trim) else {
        return Ok(DEFAULT_TIMEOUT_SECS);
    };
    match text.parse::<u64>() {
        Ok(secs) if (1..=MAX_TIMEOUT_SECS).contains(&secs) => Ok(secs),
        _ => Err(format!(
            "WUHU_APPROVAL_TIMEOUT_SECONDS must be a whole number of seconds from 1 to {MAX_TIMEOUT_SECS}, not {text:?}"
        )),
    }
}

/// When an approval created at `created` expires.
pub fn expires_at(created: Millis, timeout_secs: u64) -> Millis {
    Millis(created.0.saturating_add(timeout_secs.saturating_mul(1000)))
}

/// Where a tool call would run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target<'a> {
    /// The runner's name.
    pub runner: &'a str,
    /// The runner's owner (its token's `sub`).
    pub runner_owner: &'a str,
    /// The runner's kind (from its token).
    pub runner_kind: RunnerKind,
    /// The definition's policy when attaching one; `Auto` for everything else.
    pub policy: ApprovalPolicy,
}

/// What the session knows when a call wants to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Facts<'a> {
    /// The current turn's authors (`Session::turn_authors`).
    pub turn_authors: &'a [String],
    /// The session's owner.
    pub session_owner: &'a str,
    /// The `approve_session` answers given in this session (expired ones included or not).
    pub grants: &'a [Grant],
    /// Now.
    pub now: Millis,
}

/// Who must approve a call to `target`, or `None` when it runs at once.
///
/// A turn with no author (input that came from no person) counts as someone other than the
/// runner owner: nobody's prompt may reach a person's machine unasked.
pub fn required_approver(target: &Target<'_>, facts: &Facts<'_>) -> Option<Approver> {
    let owner = target.runner_owner;
    let approved = facts
        .grants
        .iter()
        .any(|g| g.scope == GrantScope::Machine && g.covers(owner, facts.turn_authors, facts.now));
    let someone_else = facts.turn_authors.is_empty()
        || facts
            .turn_authors
            .iter()
            .any(|author| runner_owner_must_approve(target.runner_kind, owner, author, approved));
    if target.runner_kind == RunnerKind::Local && !approved && someone_else {
        return Some(Approver::RunnerOwner(owner.to_string()));
    }
    (target.policy == ApprovalPolicy::Ask)
        .then(|| Approver::SessionOwner(facts.session_owner.to_string()))
}

/// What the call would do, for texts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action<'a> {
    /// Attach an environment.
    Attach {
        /// Its name in the session.
        environment: &'a str,
    },
    /// Run a tool in an attached environment.
    Run {
        /// The tool.
        tool: &'a str,
        /// The environment's name.
        environment: &'a str,
    },
    /// Detach an environment.
    Detach {
        /// Its name.
        environment: &'a str,
    },
    /// Give a child session an environment of this one (`spawn_session` with `inherit`): the
    /// child then works on the same machine, so sharing it is asked as attaching it is.
    Share {
        /// Its name.
        environment: &'a str,
    },
    /// A call a policy rule asks about (`crate::policy::Verdict::ask_text`).
    Policy {
        /// The tool.
        tool: &'a str,
        /// What matched and which rule asks.
        what: &'a str,
    },
}

impl Action<'_> {
    /// `attach environment "api"`, `run bash on environment "api"`, `detach environment "api"`.
    pub fn describe(&self) -> String {
        match self {
            Action::Attach { environment } => format!("attach environment {environment:?}"),
            Action::Run { tool, environment } => {
                format!("run {tool} on environment {environment:?}")
            }
            Action::Detach { environment } => format!("detach environment {environment:?}"),
            Action::Share { environment } => {
                format!("give a child session environment {environment:?}")
            }
            Action::Policy { tool, what } => format!("run {tool}: {what}"),
        }
    }
}

/// A person's answer (`POST /v1/sessions/:id/approvals/:approvalId {"decision":…}`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Answer {
    /// Run this call.
    Approve,
    /// Run this call and stop asking this runner owner in this session.
    ApproveSession,
    /// Run this call, and add a rule to the approver's own policy that allows this command
    /// (path, host) on their machines from now on (`crate::policy::always_rule`): offered only
    /// for a policy's ask about a call on the approver's own runner.
    Always,
    /// Do not run it.
    Deny,
}

impl Answer {
    /// Parses the wire name.
    pub fn parse(text: &str) -> Option<Answer> {
        match text {
            "approve" => Some(Answer::Approve),
            "approve_session" => Some(Answer::ApproveSession),
            "always" => Some(Answer::Always),
            "deny" => Some(Answer::Deny),
            _ => None,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Approve => "approve",
            Answer::ApproveSession => "approve_session",
            Answer::Always => "always",
            Answer::Deny => "deny",
        }
    }
}

/// Where an approval is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// Waiting for an answer.
    Pending,
    /// Approved (`approve` or `approve_session`).
    Approved,
    /// Denied.
    Denied,
    /// Nobody answered in time.
    Expired,
    /// The call stopped waiting (the session was stopped, or the call no longer runs).
    Withdrawn,
}

impl State {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Approved => "approved",
            State::Denied => "denied",
            State::Expired => "expired",
            State::Withdrawn => "withdrawn",
        }
    }

    /// Parses the stored name.
    pub fn parse(text: &str) -> Option<State> {
        match text {
            "pending" => Some(State::Pending),
            "approved" => Some(State::Approved),
            "denied" => Some(State::Denied),
            "expired" => Some(State::Expired),
            "withdrawn" => Some(State::Withdrawn),
            _ => None,
        }
    }
}

/// Why an answer was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The person is neither the approver nor an admin (`403 forbidden`).
    #[error("only {0} (or an admin) may answer this approval")]
    Forbidden(String),
    /// `approve_session` on an approval that is neither a runner owner's nor a policy's ask
    /// (`400`).
    #[error(
        "approve_session answers only a runner owner's approval or a policy's ask; use approve or deny"
    )]
    SessionApprovalNotOffered,
    /// `approve_session` on a request that acts for a guest (`400`): a chat user no admin
    /// mapped, or more people than a set lists.
    #[error(
        "approve_session is refused for a request that acts for a guest (a chat user no admin mapped): approve this call alone, or deny"
    )]
    SessionApprovalForGuests,
    /// `always` on an approval that offers no rule (`400`): not a policy's ask, or not about
    /// the approver's own machine, or what it matched is a pattern.
    #[error(
        "always answers only a policy's ask about a call on the approver's own runner whose command, path or host holds no * or ?; use approve or deny"
    )]
    AlwaysNotOffered,
    /// Answered before (`409 already_decided`).
    #[error("this approval was already answered")]
    AlreadyDecided,
    /// Expired (`409 expired`).
    #[error("this approval expired without an answer")]
    Expired,
    /// The call stopped waiting (`409 withdrawn`).
    #[error("this approval was withdrawn: the call no longer waits for it")]
    Withdrawn,
}

impl AnswerError {
    /// The HTTP status and error code of the refusal.
    pub fn status_and_code(&self) -> (u16, &'static str) {
        match self {
            AnswerError::Forbidden(_) => (403, "forbidden"),
            AnswerError::SessionApprovalNotOffered
            | AnswerError::SessionApprovalForGuests
            | AnswerError::AlwaysNotOffered => (400, "bad_request"),
            AnswerError::AlreadyDecided => (409, "already_decided"),
            AnswerError::Expired => (409, "expired"),
            AnswerError::Withdrawn => (409, "withdrawn"),
        }
    }
}

/// An approval as an answer finds it.
#[derive(Clone, Copy, Debug)]
pub struct Asked<'a> {
    /// Who may answer it.
    pub approver: &'a Approver,
    /// Where it is.
    pub state: State,
    /// When it expires.
    pub expires_at: Millis,
    /// Whom the call acted for when it asked.
    pub requested_by: &'a [String],
    /// Whether the request carries a rule for [`Answer::Always`].
    pub always_offered: bool,
    /// Whether it is a policy's ask (`approve_session` is then offered whoever the approver).
    pub policy_ask: bool,
}

/// The state after `who` answers `asked` with `answer` at `now`. Authority comes first:
/// someone who may not answer learns nothing about the approval's state. An approval past its
/// expiry is expired even if the alarm has not run yet.
///
/// # Errors
/// An [`AnswerError`] for the first rule broken.
pub fn answer(
    who: &Principal,
    asked: &Asked<'_>,
    now: Millis,
    answer: Answer,
) -> Result<State, AnswerError> {
    let Asked {
        approver,
        state,
        expires_at,
        requested_by,
        always_offered,
        policy_ask,
    } = *asked;
    if !may_answer_approval(who, approver) {
        let (Approver::RunnerOwner(sub) | Approver::SessionOwner(sub)) = approver;
        return Err(AnswerError::Forbidden(sub.clone()));
    }
    match state {
        State::Approved | State::Denied => return Err(AnswerError::AlreadyDecided),
        State::Expired => return Err(AnswerError::Expired),
        State::Withdrawn => return Err(AnswerError::Withdrawn),
        State::Pending if now >= expires_at => return Err(AnswerError::Expired),
        State::Pending => {}
    }
    match (answer, approver) {
        (Answer::ApproveSession, Approver::SessionOwner(_)) if !policy_ask => {
            Err(AnswerError::SessionApprovalNotOffered)
        }
        (Answer::ApproveSession, _) if !session_approval_offered(requested_by) => {
            Err(AnswerError::SessionApprovalForGuests)
        }
        (Answer::Always, _) if !always_offered => Err(AnswerError::AlwaysNotOffered),
        (Answer::Approve | Answer::ApproveSession | Answer::Always, _) => Ok(State::Approved),
        (Answer::Deny, _) => Ok(State::Denied),
    }
}

/// Whether `approve_session` may answer a request made for `requested_by`: not when it acts
/// for a guest.
pub fn session_approval_offered(requested_by: &[String]) -> bool {
    !requested_by.iter().any(|p| crate::authority::is_guest(p))
}

/// Whether a pending approval for `approver` (a policy's ask when `policy_ask`), requested
/// for `requested_by`, is approved by `grant` (just given) at `now`.
pub fn covered_by(
    approver: &Approver,
    requested_by: &[String],
    policy_ask: bool,
    grant: &Grant,
    now: Millis,
) -> bool {
    match grant.scope {
        GrantScope::Machine => {
            matches!(approver, Approver::RunnerOwner(owner) if grant.covers(owner, requested_by, now))
        }
        GrantScope::Policy => {
            policy_ask
                && policy_ask_covered(approver, std::slice::from_ref(grant), requested_by, now)
        }
    }
}

/// Whether an approval in `state` expiring at `expires_at` must be expired at `now`.
pub fn is_due(state: State, expires_at: Millis, now: Millis) -> bool {
    state == State::Pending && now >= expires_at
}

/// Whether one more approval may be requested when `pending` already wait.
///
/// # Errors
/// The tool error the call gets when the session already holds [`MAX_PENDING_PER_SESSION`].
pub fn admit(pending: usize, action: &Action<'_>) -> Result<(), String> {
    if pending < MAX_PENDING_PER_SESSION {
        Ok(())
    } else {
        Err(format!(
            "Too many approvals are already waiting in this session ({MAX_PENDING_PER_SESSION}): the call to {} did not run. Wait for answers before asking for more.",
            action.describe()
        ))
    }
}

/// How a call's wait for approval ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Approved: the call runs.
    Approved,
    /// Denied by `by`.
    Denied {
        /// Who denied it.
        by: String,
    },
    /// Nobody answered within the timeout.
    Expired {
        /// The timeout, in seconds.
        after_secs: u64,
    },
    /// The call stopped waiting (the session was stopped).
    Withdrawn,
    /// Not requested: too many approvals wait ([`admit`]); the message says so.
    Refused(String),
}

impl Outcome {
    /// The outcome an approval in `state` stands for (`None` while pending); `timeout_secs`
    /// is the wait it was given.
    pub fn of_state(state: State, decided_by: Option<&str>, timeout_secs: u64) -> Option<Outcome> {
        match state {
            State::Pending => None,
            State::Approved => Some(Outcome::Approved),
            State::Denied => Some(Outcome::Denied {
                by: decided_by.unwrap_or("someone").to_string(),
            }),
            State::Expired => Some(Outcome::Expired {
                after_secs: timeout_secs,
            }),
            State::Withdrawn => Some(Outcome::Withdrawn),
        }
    }
}

/// The tool error a call gets for an outcome other than approval.
pub fn outcome_error(
    outcome: &Outcome,
    action: &Action<'_>,
    approver: &Approver,
) -> Option<String> {
    let what = action.describe();
    let (Approver::RunnerOwner(who) | Approver::SessionOwner(who)) = approver;
    match outcome {
        Outcome::Approved => None,
        Outcome::Denied { by } => Some(format!(
            "{by} denied the approval to {what}: the call did not run. Do not retry unless they ask."
        )),
        Outcome::Expired { after_secs } => Some(format!(
            "The approval to {what} expired: {who} did not answer within {}, and the call did not run. Ask {who} before trying again.",
            duration_text(*after_secs)
        )),
        Outcome::Withdrawn => Some(format!(
            "The approval to {what} was withdrawn (the session was stopped): the call did not run."
        )),
        Outcome::Refused(message) => Some(message.clone()),
    }
}

/// The `text` of a `wuhu_approval_request_v1` entry: what waits, for whom, and how to answer.
pub fn request_text(
    action: &Action<'_>,
    target: Option<&Target<'_>>,
    approver: &Approver,
    turn_authors: &[String],
    answer_path: &str,
    timeout_secs: u64,
    grant_secs: u64,
) -> String {
    let what = action.describe();
    // A call that reaches no runner (a policy's ask about a `js` fetch, say) names none.
    let on_runner = target
        .map(|target| {
            format!(
                " on runner {:?} ({}, owned by {})",
                target.runner,
                target.runner_kind.as_str(),
                target.runner_owner
            )
        })
        .unwrap_or_default();
    let asker = match turn_authors {
        [] => "This session".to_string(),
        [one] => format!("{one}'s message"),
        many => format!("A turn with messages from {}", many.join(", ")),
    };
    let within = duration_text(timeout_secs);
    let for_whom = match turn_authors {
        [] => "turns nobody prompted".to_string(),
        people => people.join(", "),
    };
    match approver {
        Approver::RunnerOwner(owner) if session_approval_offered(turn_authors) => format!(
            "Approval needed from {owner} (the runner's owner): {asker} asks to {what}{on_runner}. \
             Answer with POST {answer_path} {{\"decision\":\"approve\"|\"approve_session\"|\"deny\"}} within {within} \
             (\"approve_session\" stops asking {owner} in this session for {for_whom}, for {}).",
            duration_text(grant_secs)
        ),
        Approver::RunnerOwner(owner) => format!(
            "Approval needed from {owner} (the runner's owner): {asker} asks to {what}{on_runner}. \
             Answer with POST {answer_path} {{\"decision\":\"approve\"|\"deny\"}} within {within} \
             (\"approve_session\" is not offered: the request acts for a guest)."
        ),
        Approver::SessionOwner(owner)
            if matches!(action, Action::Policy { .. })
                && session_approval_offered(turn_authors) =>
        {
            format!(
                "Approval needed from {owner} (the session's owner): {asker} asks to {what}{on_runner}. \
                 Answer with POST {answer_path} {{\"decision\":\"approve\"|\"approve_session\"|\"deny\"}} within {within} \
                 (\"approve_session\" stops this policy asking {owner} in this session for {for_whom}, for {}).",
                duration_text(grant_secs)
            )
        }
        Approver::SessionOwner(owner) => format!(
            "Approval needed from {owner} (the session's owner): {asker} asks to {what}{on_runner}. \
             Answer with POST {answer_path} {{\"decision\":\"approve\"|\"deny\"}} within {within}."
        ),
    }
}

/// The most characters of what would run or change a card shows.
pub const CARD_DETAIL_CHARS: usize = 1_500;

/// A request as people read it (the web app's card, `wuhu chat`, chat channels): who asks to
/// do what, and where. The model's `text` says the same with how to answer through the API;
/// people answer with buttons.
pub fn people_text(
    action: &Action<'_>,
    target: Option<&Target<'_>>,
    turn_authors: &[String],
) -> String {
    let (asker, asks) = match turn_authors {
        [] => ("This session (nobody prompted it)".to_string(), "asks"),
        [one] => (one.clone(), "asks"),
        many => (many.join(", "), "ask"),
    };
    let on_runner = target
        .map(|t| {
            format!(
                " on {}'s {} runner {:?}",
                t.runner_owner,
                t.runner_kind.as_str(),
                t.runner
            )
        })
        .unwrap_or_default();
    format!("{asker} {asks} to {}{on_runner}.", action.describe())
}

/// What people are shown of a request (the data of a `wuhu_approval_request_v1`): its `summary`
/// (who asks to do what, where), then exactly what would run or change (`command`, `diff`,
/// `content` or `url`, at most [`CARD_DETAIL_CHARS`]) in a fenced block. A request stored
/// before summaries existed shows its `text`.
pub fn card_text(data: &serde_json::Value) -> String {
    let Some(summary) = data["summary"].as_str() else {
        return data["text"]
            .as_str()
            .unwrap_or("An approval is needed.")
            .to_string();
    };
    let detail = ["command", "diff", "content", "url"]
        .iter()
        .find_map(|key| data[*key].as_str().filter(|d| !d.is_empty()));
    match detail {
        None => summary.to_string(),
        Some(detail) => {
            let mut shown: String = detail.chars().take(CARD_DETAIL_CHARS).collect();
            if shown.len() < detail.len() {
                shown.push('…');
            }
            // A fence longer than any run of backticks inside, so the block cannot be closed early.
            let longest = shown.split(|c| c != '`').map(str::len).max().unwrap_or(0);
            let fence = "`".repeat(longest.max(2) + 1);
            format!("{summary}\n{fence}\n{shown}\n{fence}")
        }
    }
}

fn duration_text(secs: u64) -> String {
    match secs {
        s if s % 3600 == 0 => plural(s / 3600, "hour"),
        s if s % 60 == 0 => plural(s / 60, "minute"),
        s => plural(s, "second"),
    }
}

fn plural(n: u64, unit: &str) -> String {
    if n == 1 {
        format!("1 {unit}")
    } else {
        format!("{n} {unit}s")
    }
}

/// The approval requests in `entries` (a transcript in cursor order) that no decision entry
/// answers yet: each `wuhu_approval_request_v1`'s `data`, oldest first. A client reading a
/// transcript (the CLI's `approvals list`, `wuhu chat`) asks these; an expired or withdrawn
/// request is decided too (its decision entry says so), so it is not listed.
pub fn pending_requests(entries: &[Entry]) -> Vec<&serde_json::Value> {
    let mut pending: Vec<&serde_json::Value> = Vec::new();
    for entry in entries {
        let EntryPayload::Custom { custom_type, data } = &entry.payload else {
            continue;
        };
        let id = &data["approvalId"];
        match custom_type.as_str() {
            custom_types::APPROVAL_REQUESTED => pending.push(data),
            custom_types::APPROVAL_DECIDED => pending.retain(|p| p["approvalId"] != *id),
            _ => {}
        }
    }
    pending
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asked<'a>(
        approver: &'a Approver,
        state: State,
        expires_at: Millis,
        requested_by: &'a [String],
        always_offered: bool,
    ) -> Asked<'a> {
        Asked {
            approver,
            state,
            expires_at,
            requested_by,
            always_offered,
            policy_ask: always_offered,
        }
    }
    use crate::authority::Role;
    use crate::session::Session;
    use crate::wire::{Header, Lane};

    fn user(sub: &str, role: Role) -> Principal {
        Principal {
            sub: sub.into(),
            tenant: "acme".into(),
            role,
        }
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn who_must_approve() {
        use ApprovalPolicy::{Ask, Auto};
        use RunnerKind::{Cloud, Local};
        let alice = || Some(Approver::RunnerOwner("alice".into()));
        let session_owner = || Some(Approver::SessionOwner("carol".into()));
        // (runner kind, runner owner, policy, turn authors, approved owners, expected)
        type Case = (
            RunnerKind,
            &'static str,
            ApprovalPolicy,
            &'static [&'static str],
            &'static [&'static str],
            Option<Approver>,
        );
        let cases: Vec<Case> = vec![
            // The owner's own prompt reaches their machine unasked.
            (Local, "alice", Auto, &["alice"], &[], None),
            // Someone else's prompt waits for the owner, whatever the policy says.
            (Local, "alice", Auto, &["bob"], &[], alice()),
            (Local, "alice", Ask, &["bob"], &[], alice()),
            // A turn with several authors: one of them is not the owner.
            (Local, "alice", Auto, &["alice", "bob"], &[], alice()),
            (Local, "alice", Auto, &["bob", "alice"], &[], alice()),
            // Input from nobody counts as someone else.
            (Local, "alice", Auto, &[], &[], alice()),
            // approve_session stops the asking, for that owner only.
            (Local, "alice", Auto, &["bob"], &["alice"], None),
            (Local, "alice", Auto, &["bob"], &["dave"], alice()),
            // ... and then the definition's own policy applies.
            (Local, "alice", Ask, &["bob"], &["alice"], session_owner()),
            // The owner's own prompt still follows an `ask` definition.
            (Local, "alice", Ask, &["alice"], &[], session_owner()),
            // Cloud runners follow the definition only.
            (Cloud, "ops", Auto, &["bob"], &[], None),
            (Cloud, "ops", Ask, &["bob"], &[], session_owner()),
            (Cloud, "ops", Ask, &[], &[], session_owner()),
        ];
        for (kind, owner, policy, authors, approved, want) in cases {
            let target = Target {
                runner: "mac",
                runner_owner: owner,
                runner_kind: kind,
                policy,
            };
            let authors = strings(authors);
            // Each approving owner's grant covers this turn's people and has not expired.
            let grants: Vec<Grant> = approved
                .iter()
                .map(|o| Grant {
                    scope: GrantScope::Machine,
                    runner_owner: o.to_string(),
                    covers: authors.clone(),
                    expires_at: Millis(2),
                })
                .collect();
            let facts = Facts {
                turn_authors: &authors,
                session_owner: "carol",
                grants: &grants,
                now: Millis(1),
            };
            assert_eq!(
                required_approver(&target, &facts),
                want,
                "{kind:?} owned by {owner}, {policy:?}, authors {authors:?}, approved {approved:?}"
            );
        }
    }

    #[test]
    fn who_may_answer_and_how() {
        use Answer::*;
        use AnswerError as E;
        let alice = user("alice", Role::Member);
        let bob = user("bob", Role::Member);
        let root = user("root", Role::Admin);
        let mac = Approver::RunnerOwner("alice".into());
        let ask = Approver::SessionOwner("bob".into());
        let later = Millis(10_000);
        let now = Millis(5_000);
        let forbidden_alice = || Err(E::Forbidden("alice".into()));
        // (who, approver, state, now, answer, expected)
        type Case<'a> = (
            &'a Principal,
            &'a Approver,
            State,
            Millis,
            Answer,
            Result<State, AnswerError>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                &alice,
                &mac,
                State::Pending,
                now,
                Approve,
                Ok(State::Approved),
            ),
            (
                &alice,
                &mac,
                State::Pending,
                now,
                ApproveSession,
                Ok(State::Approved),
            ),
            (&alice, &mac, State::Pending, now, Deny, Ok(State::Denied)),
            (
                &root,
                &mac,
                State::Pending,
                now,
                Approve,
                Ok(State::Approved),
            ),
            (
                &root,
                &mac,
                State::Pending,
                now,
                ApproveSession,
                Ok(State::Approved),
            ),
            // The prompter cannot approve their own way onto someone's machine.
            (&bob, &mac, State::Pending, now, Approve, forbidden_alice()),
            (&bob, &mac, State::Pending, now, Deny, forbidden_alice()),
            // Forbidden comes before the state: no information leaks.
            (&bob, &mac, State::Approved, now, Approve, forbidden_alice()),
            (&bob, &mac, State::Expired, now, Approve, forbidden_alice()),
            // A definition's `ask` goes to the session owner.
            (
                &bob,
                &ask,
                State::Pending,
                now,
                Approve,
                Ok(State::Approved),
            ),
            (
                &alice,
                &ask,
                State::Pending,
                now,
                Approve,
                Err(E::Forbidden("bob".into())),
            ),
            (&root, &ask, State::Pending, now, Deny, Ok(State::Denied)),
            (
                &bob,
                &ask,
                State::Pending,
                now,
                ApproveSession,
                Err(E::SessionApprovalNotOffered),
            ),
            // Endings are final.
            (
                &alice,
                &mac,
                State::Approved,
                now,
                Deny,
                Err(E::AlreadyDecided),
            ),
            (
                &alice,
                &mac,
                State::Denied,
                now,
                Approve,
                Err(E::AlreadyDecided),
            ),
            (&alice, &mac, State::Expired, now, Approve, Err(E::Expired)),
            (
                &alice,
                &mac,
                State::Withdrawn,
                now,
                Approve,
                Err(E::Withdrawn),
            ),
            // Past its expiry an approval is expired, even before the alarm ran.
            (
                &alice,
                &mac,
                State::Pending,
                later,
                Approve,
                Err(E::Expired),
            ),
            (
                &alice,
                &mac,
                State::Pending,
                Millis(9_999),
                Approve,
                Ok(State::Approved),
            ),
        ];
        let bob_asked = strings(&["bob"]);
        for (who, approver, state, now, given, want) in cases {
            assert_eq!(
                answer(
                    who,
                    &asked(approver, state, Millis(10_000), &bob_asked, false),
                    now,
                    given
                ),
                want,
                "{} answers {given:?} to {approver:?} in {state:?} at {now:?}",
                who.sub
            );
        }
        assert_eq!(
            E::Forbidden("a".into()).status_and_code(),
            (403, "forbidden")
        );
        assert_eq!(
            E::AlreadyDecided.status_and_code(),
            (409, "already_decided")
        );
        assert_eq!(E::Expired.status_and_code(), (409, "expired"));
        // approve_session is refused for a request that acts for a guest (a chat user no
        // admin mapped, or the `*` of an overflowing set); approve and deny still answer it.
        for requested_by in [
            &["telegram:42"][..],
            &["bob", "slack:U9"],
            &["bob", crate::session::MORE_PRINCIPALS],
        ] {
            let requested_by = strings(requested_by);
            for (given, want) in [
                (ApproveSession, Err(E::SessionApprovalForGuests)),
                (Approve, Ok(State::Approved)),
                (Deny, Ok(State::Denied)),
            ] {
                for who in [&alice, &root] {
                    assert_eq!(
                        answer(
                            who,
                            &asked(&mac, State::Pending, later, &requested_by, false),
                            now,
                            given
                        ),
                        want,
                        "{} answers {given:?} for {requested_by:?}",
                        who.sub
                    );
                }
            }
            // Someone who may not answer still learns nothing.
            assert_eq!(
                answer(
                    &bob,
                    &asked(&mac, State::Pending, later, &requested_by, false),
                    now,
                    ApproveSession
                ),
                forbidden_alice()
            );
        }
        // `always` answers only a request that offers a rule; the approver and admins alike.
        for who in [&alice, &root] {
            assert_eq!(
                answer(
                    who,
                    &asked(&mac, State::Pending, later, &bob_asked, false),
                    now,
                    Always
                ),
                Err(E::AlwaysNotOffered)
            );
            assert_eq!(
                answer(
                    who,
                    &asked(&mac, State::Pending, later, &bob_asked, true),
                    now,
                    Always
                ),
                Ok(State::Approved)
            );
        }
        assert_eq!(
            answer(
                &bob,
                &asked(&mac, State::Pending, later, &bob_asked, true),
                now,
                Always
            ),
            forbidden_alice()
        );
        assert_eq!(E::AlwaysNotOffered.status_and_code(), (400, "bad_request"));
        assert_eq!(
            E::SessionApprovalForGuests.status_and_code(),
            (400, "bad_request")
        );
    }

    /// "For this session" on a policy's ask (decision 0038): whoever the approver, it stops that
    /// policy asking them for the same people; it never opens a machine, except when the runner
    /// owner answered about their own machine.
    #[test]
    fn approve_session_on_a_policys_ask_covers_that_persons_asks_only() {
        let owner = Approver::SessionOwner("alice".into());
        let mac = Approver::RunnerOwner("alice".into());
        let bob = strings(&["bob"]);
        let now = Millis(1_000);
        let grants = session_grants(&owner, Answer::ApproveSession, &bob, true, now, 60);
        assert_eq!(
            grants.iter().map(|g| g.scope).collect::<Vec<_>>(),
            [GrantScope::Policy]
        );
        let both = session_grants(&mac, Answer::ApproveSession, &bob, true, now, 60);
        assert_eq!(
            both.iter().map(|g| g.scope).collect::<Vec<_>>(),
            [GrantScope::Machine, GrantScope::Policy]
        );
        let later = Millis(2_000);
        // (approver of the next ask, its people, covered?)
        let cases = [
            (&owner, &["bob"][..], true),
            (&mac, &["bob"], true),
            (&owner, &["carol"], false),
            (&owner, &["bob", "carol"], false),
            (&Approver::SessionOwner("dave".into()), &["bob"], false),
        ];
        for (approver, turn, want) in cases {
            assert_eq!(
                policy_ask_covered(approver, &grants, &strings(turn), later),
                want,
                "{approver:?} {turn:?}"
            );
        }
        assert!(!policy_ask_covered(&owner, &grants, &bob, Millis(61_000)));
        // A policy grant opens no machine; a machine grant answers no tenant rule's ask.
        let target = Target {
            runner: "mac",
            runner_owner: "alice",
            runner_kind: RunnerKind::Local,
            policy: ApprovalPolicy::Auto,
        };
        let facts = Facts {
            turn_authors: &bob,
            session_owner: "alice",
            grants: &grants,
            now: later,
        };
        assert_eq!(
            required_approver(&target, &facts),
            Some(Approver::RunnerOwner("alice".into()))
        );
        let machine = session_grants(&mac, Answer::ApproveSession, &bob, false, now, 60);
        assert!(!policy_ask_covered(&owner, &machine, &bob, later));
        // Pending approvals it answers at once: that person's policy asks only.
        assert!(covered_by(&owner, &bob, true, &grants[0], later));
        assert!(!covered_by(&owner, &bob, false, &grants[0], later));
        assert!(!covered_by(&mac, &bob, false, &grants[0], later));
        // approve_session is offered on a policy's ask to the session's owner too.
        let pending = |policy_ask| Asked {
            approver: &owner,
            state: State::Pending,
            expires_at: Millis(10_000),
            requested_by: &bob,
            always_offered: false,
            policy_ask,
        };
        let alice = Principal {
            sub: "alice".into(),
            tenant: "t".into(),
            role: crate::authority::Role::Member,
        };
        assert_eq!(
            answer(&alice, &pending(true), now, Answer::ApproveSession),
            Ok(State::Approved)
        );
        assert_eq!(
            answer(&alice, &pending(false), now, Answer::ApproveSession),
            Err(AnswerError::SessionApprovalNotOffered)
        );
    }

    #[test]
    fn approve_session_covers_the_people_it_was_given_for_until_it_expires() {
        let mac = Approver::RunnerOwner("alice".into());
        let ask = Approver::SessionOwner("alice".into());
        let grant = session_grants(
            &mac,
            Answer::ApproveSession,
            &strings(&["carol", "bob", "bob"]),
            false,
            Millis(1_000),
            60,
        )
        .remove(0);
        assert_eq!(
            grant,
            Grant {
                scope: GrantScope::Machine,
                runner_owner: "alice".into(),
                covers: strings(&["bob", "carol"]),
                expires_at: Millis(61_000),
            }
        );
        for (approver, given) in [
            (&mac, Answer::Approve),
            (&mac, Answer::Deny),
            (&mac, Answer::Always),
            (&ask, Answer::ApproveSession),
        ] {
            assert_eq!(
                session_grants(approver, given, &[], false, Millis(0), 60),
                vec![]
            );
        }
        let nobody =
            session_grants(&mac, Answer::ApproveSession, &[], false, Millis(0), 60).remove(0);
        let before = Millis(60_999);
        let at_end = Millis(61_000);
        // (runner owner, the turn's people, when, covered?)
        type Case = (&'static str, &'static [&'static str], Millis, bool);
        let cases: Vec<Case> = vec![
            ("alice", &["bob"], before, true),
            ("alice", &["carol"], before, true),
            ("alice", &["bob", "carol"], before, true),
            // Someone outside the set asks again: a later prompt by dave in the same chat.
            ("alice", &["dave"], before, false),
            ("alice", &["bob", "dave"], before, false),
            // A guest or an overflowing set never, even when listed.
            ("alice", &["bob", "slack:U1"], before, false),
            (
                "alice",
                &["bob", crate::session::MORE_PRINCIPALS],
                before,
                false,
            ),
            // A turn for nobody is not a turn for bob.
            ("alice", &[], before, false),
            // Another owner's machine is not covered.
            ("dave", &["bob"], before, false),
            // It expires.
            ("alice", &["bob"], at_end, false),
            ("alice", &["bob"], Millis(u64::MAX), false),
        ];
        for (owner, turn, now, want) in cases {
            assert_eq!(
                grant.covers(owner, &strings(turn), now),
                want,
                "{owner} {turn:?} at {now:?}"
            );
        }
        // A grant given for nobody covers turns for nobody only.
        assert!(nobody.covers("alice", &[], Millis(1)));
        assert!(!nobody.covers("alice", &strings(&["bob"]), Millis(1)));
        // Pending approvals are approved with it only when it covers them.
        assert!(covered_by(&mac, &strings(&["bob"]), false, &grant, before));
        assert!(!covered_by(
            &mac,
            &strings(&["dave"]),
            false,
            &grant,
            before
        ));
        assert!(!covered_by(&mac, &strings(&["bob"]), false, &grant, at_end));
        assert!(!covered_by(&ask, &strings(&["bob"]), false, &grant, before));
        // The call that asked no longer asks while covered, and asks again once not.
        let target = Target {
            runner: "mac",
            runner_owner: "alice",
            runner_kind: RunnerKind::Local,
            policy: ApprovalPolicy::Auto,
        };
        let grants = [grant];
        for (turn, now, asks) in [
            (&["bob"][..], before, false),
            (&["bob", "carol"], before, false),
            (&["dave"], before, true),
            (&["bob"], at_end, true),
            (&[], before, true),
        ] {
            let turn = strings(turn);
            let facts = Facts {
                turn_authors: &turn,
                session_owner: "alice",
                grants: &grants,
                now,
            };
            assert_eq!(
                required_approver(&target, &facts),
                asks.then(|| mac.clone()),
                "{turn:?} at {now:?}"
            );
        }
    }

    #[test]
    fn approve_session_lasts_an_hour_unless_configured() {
        assert_eq!(grant_secs(None), Ok(DEFAULT_GRANT_SECS));
        assert_eq!(DEFAULT_GRANT_SECS, 3600);
        assert_eq!(grant_secs(Some("1")), Ok(1));
        assert_eq!(grant_secs(Some(" 90 ")), Ok(90));
        assert_eq!(grant_secs(Some("604800")), Ok(MAX_TIMEOUT_SECS));
        for bad in ["0", "-1", "1.5", "", "forever", "604801"] {
            let error = grant_secs(Some(bad)).unwrap_err();
            assert!(error.contains("WUHU_APPROVE_SESSION_SECONDS"), "{error}");
        }
    }

    #[test]
    fn expiry() {
        assert_eq!(timeout_secs(None), Ok(DEFAULT_TIMEOUT_SECS));
        assert_eq!(timeout_secs(Some("2")), Ok(2));
        assert_eq!(timeout_secs(Some(" 60 ")), Ok(60));
        assert_eq!(timeout_secs(Some("604800")), Ok(MAX_TIMEOUT_SECS));
        for bad in ["0", "-1", "1.5", "", "soon", "604801"] {
            let error = timeout_secs(Some(bad)).unwrap_err();
            assert!(error.contains("WUHU_APPROVAL_TIMEOUT_SECONDS"), "{error}");
        }
        let created = Millis(1_000);
        let at = expires_at(created, 3);
        assert_eq!(at, Millis(4_000));
        assert!(!is_due(State::Pending, at, Millis(3_999)));
        assert!(is_due(State::Pending, at, Millis(4_000)));
        for ended in [
            State::Approved,
            State::Denied,
            State::Expired,
            State::Withdrawn,
        ] {
            assert!(!is_due(ended, at, Millis(9_999)));
        }
        assert_eq!(
            expires_at(Millis(u64::MAX - 1), MAX_TIMEOUT_SECS),
            Millis(u64::MAX)
        );
    }

    #[test]
    fn outcomes_and_bound() {
        let action = Action::Run {
            tool: "bash",
            environment: "api",
        };
        let mac = Approver::RunnerOwner("alice".into());
        assert_eq!(outcome_error(&Outcome::Approved, &action, &mac), None);
        let denied = outcome_error(&Outcome::Denied { by: "alice".into() }, &action, &mac).unwrap();
        assert!(
            denied.contains("alice denied") && denied.contains("run bash on environment \"api\""),
            "{denied}"
        );
        let expired = outcome_error(&Outcome::Expired { after_secs: 3600 }, &action, &mac).unwrap();
        assert!(
            expired.contains("expired") && expired.contains("alice") && expired.contains("1 hour"),
            "{expired}"
        );
        let withdrawn = outcome_error(&Outcome::Withdrawn, &action, &mac).unwrap();
        assert!(withdrawn.contains("withdrawn"), "{withdrawn}");
        assert_eq!(admit(0, &action), Ok(()));
        assert_eq!(admit(MAX_PENDING_PER_SESSION - 1, &action), Ok(()));
        let refused = admit(MAX_PENDING_PER_SESSION, &action).unwrap_err();
        assert!(refused.contains("Too many approvals"), "{refused}");
        assert_eq!(
            Outcome::of_state(State::Denied, Some("root"), 5),
            Some(Outcome::Denied { by: "root".into() })
        );
        assert_eq!(Outcome::of_state(State::Pending, None, 5), None);
        assert_eq!(
            Outcome::of_state(State::Expired, None, 5),
            Some(Outcome::Expired { after_secs: 5 })
        );
        for state in [
            State::Pending,
            State::Approved,
            State::Denied,
            State::Expired,
            State::Withdrawn,
        ] {
            assert_eq!(State::parse(state.as_str()), Some(state));
        }
        for answer in [Answer::Approve, Answer::ApproveSession, Answer::Deny] {
            assert_eq!(Answer::parse(answer.as_str()), Some(answer));
        }
        assert_eq!(Answer::parse("yes"), None);
    }

    #[test]
    fn request_text_names_the_runner_owner_and_the_answers() {
        let target = Target {
            runner: "mac",
            runner_owner: "alice",
            runner_kind: RunnerKind::Local,
            policy: ApprovalPolicy::Auto,
        };
        let action = Action::Run {
            tool: "bash",
            environment: "api",
        };
        let text = request_text(
            &action,
            Some(&target),
            &Approver::RunnerOwner("alice".into()),
            &strings(&["bob"]),
            "/v1/sessions/s/approvals/a",
            120,
            3600,
        );
        for needle in [
            "from alice (the runner's owner)",
            "bob's message asks to run bash on environment \"api\"",
            "runner \"mac\" (local, owned by alice)",
            "POST /v1/sessions/s/approvals/a",
            "approve_session",
            "2 minutes",
            "stops asking alice in this session for bob, for 1 hour",
        ] {
            assert!(text.contains(needle), "{needle:?} not in {text}");
        }
        // A request for a guest does not offer approve_session.
        let text = request_text(
            &action,
            Some(&target),
            &Approver::RunnerOwner("alice".into()),
            &strings(&["bob", "telegram:42"]),
            "/p",
            120,
            3600,
        );
        assert!(text.contains("\"approve\"|\"deny\""), "{text}");
        assert!(
            text.contains("not offered: the request acts for a guest"),
            "{text}"
        );
        let text = request_text(
            &Action::Attach { environment: "web" },
            Some(&Target {
                runner_kind: RunnerKind::Cloud,
                runner_owner: "ops",
                ..target
            }),
            &Approver::SessionOwner("carol".into()),
            &strings(&["bob", "dave"]),
            "/p",
            7,
            3600,
        );
        assert!(text.contains("from carol (the session's owner)"), "{text}");
        assert!(text.contains("messages from bob, dave"), "{text}");
        assert!(
            text.contains("owned by ops") && text.contains("7 seconds"),
            "{text}"
        );
        assert!(!text.contains("approve_session"), "{text}");
    }

    fn session() -> Session {
        let header = Header {
            system_prompt: "s".into(),
            provider: "fake".into(),
            model: "m".into(),
            reasoning: None,
        };
        let mut session = Session::create(Millis(1), 1, header, vec![]);
        while session.poll_effect().is_some() {}
        session
    }

    fn call(id: &str, name: &str) -> crate::wire::ContentBlock {
        crate::wire::ContentBlock::ToolCall(crate::wire::ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: serde_json::json!({}),
        })
    }

    fn tool_message(calls: Vec<crate::wire::ContentBlock>) -> crate::wire::AssistantMessage {
        crate::wire::AssistantMessage {
            content: calls,
            stop_reason: crate::wire::StopReason::ToolUse,
            ..Default::default()
        }
    }

    fn text_message(text: &str) -> crate::wire::AssistantMessage {
        crate::wire::AssistantMessage {
            content: vec![crate::wire::ContentBlock::Text { text: text.into() }],
            ..Default::default()
        }
    }

    fn enqueue(session: &mut Session, id: &str, lane: Lane, author: &str) {
        session
            .handle_enqueue(Millis(2), id.into(), lane, author.into(), id.into())
            .unwrap();
    }

    #[test]
    fn turn_authors_follow_the_turn() {
        let mut s = session();
        assert_eq!(s.turn_authors(), [] as [String; 0]);
        // alice starts a turn; bob's follow-up waits for the next one.
        enqueue(&mut s, "a", Lane::FollowUp, "alice");
        assert_eq!(s.turn_authors(), ["alice"]);
        assert_eq!(s.turn_author(), Some("alice"));
        enqueue(&mut s, "b", Lane::FollowUp, "bob");
        assert_eq!(s.turn_authors(), ["alice"]);
        s.handle_inference_done(Millis(3), 1, Ok(tool_message(vec![call("c1", "bash")])));
        // carol's steer joins the running turn at the next step boundary.
        enqueue(&mut s, "c", Lane::Steer, "carol");
        s.handle_tool_done(Millis(4), 1, "c1", "ok".into(), false);
        assert_eq!(s.turn_authors(), ["alice", "carol"]);
        // The agent stops; bob's follow-up starts a new turn of its own.
        s.handle_inference_done(Millis(5), 2, Ok(text_message("done")));
        assert_eq!(s.turn_authors(), ["bob"]);
        assert_eq!(s.turn_author(), Some("bob"));
        // Survives a checkpoint round trip.
        let json = serde_json::to_string(s.checkpoint()).unwrap();
        let restored =
            Session::restore(serde_json::from_str(&json).unwrap(), s.queue().to_vec(), 2);
        assert_eq!(restored.turn_authors(), s.turn_authors());
        // A checkpoint from before this field loads with no authors.
        let mut old: serde_json::Value = serde_json::to_value(s.checkpoint()).unwrap();
        old.as_object_mut().unwrap().remove("turnAuthors");
        let old: crate::session::Checkpoint = serde_json::from_value(old).unwrap();
        assert!(old.turn_authors.is_empty());
    }

    #[test]
    fn followups_delivered_together_all_count_and_the_list_is_bounded() {
        let mut s = session();
        enqueue(&mut s, "a", Lane::FollowUp, "alice");
        enqueue(&mut s, "b", Lane::FollowUp, "bob");
        enqueue(&mut s, "c", Lane::FollowUp, "alice");
        enqueue(&mut s, "d", Lane::FollowUp, "carol");
        s.handle_inference_done(Millis(3), 1, Ok(text_message("done")));
        assert_eq!(s.turn_authors(), ["bob", "alice", "carol"]);
        s.handle_inference_done(Millis(4), 2, Ok(text_message("done")));
        for i in 0..crate::session::MAX_TURN_AUTHORS + 5 {
            enqueue(&mut s, &format!("x{i}"), Lane::FollowUp, &format!("u{i}"));
        }
        // u0 started a turn alone; the rest arrive together in the next one.
        assert_eq!(s.turn_authors(), ["u0"]);
        s.handle_inference_done(Millis(5), 3, Ok(text_message("done")));
        // Bounded, and nobody is lost to the bound: the rest are `*`, which is nobody's sub, so
        // a rule that needs every principal's consent never finds it.
        assert_eq!(s.turn_authors().len(), crate::session::MAX_TURN_AUTHORS + 1);
        assert_eq!(
            s.turn_authors().last().map(String::as_str),
            Some(crate::session::MORE_PRINCIPALS)
        );
        assert_eq!(s.turn_author(), Some("u1"));
        // However many acted, u1's machine still waits for u1.
        let target = Target {
            runner: "mac",
            runner_owner: "u1",
            runner_kind: RunnerKind::Local,
            policy: ApprovalPolicy::Auto,
        };
        let facts = Facts {
            turn_authors: s.turn_authors(),
            session_owner: "u1",
            grants: &[],
            now: Millis(0),
        };
        assert!(required_approver(&target, &facts).is_some());
    }

    #[test]
    fn a_call_waiting_for_approval_runs_again_after_a_restart() {
        let mut s = session();
        enqueue(&mut s, "a", Lane::FollowUp, "bob");
        s.handle_inference_done(Millis(3), 1, Ok(tool_message(vec![call("wait", "bash")])));
        s.handle_tool_awaiting_approval(1, "wait", true);
        assert!(s.is_tool_awaiting_approval("wait"));
        // Marking a call that does not run changes nothing.
        s.handle_tool_awaiting_approval(1, "nope", true);
        s.handle_tool_awaiting_approval(7, "wait", true);
        assert_eq!(s.checkpoint().awaiting_approval, ["wait"]);
        let json = serde_json::to_string(s.checkpoint()).unwrap();
        let mut restored =
            Session::restore(serde_json::from_str(&json).unwrap(), s.queue().to_vec(), 2);
        restored.handle_resume(Millis(10));
        let effects: Vec<_> = std::iter::from_fn(|| restored.poll_effect()).collect();
        assert!(
            matches!(effects.as_slice(), [crate::session::Effect::RunTools { step: 1, calls }] if calls[0].id == "wait"),
            "{effects:?}"
        );
        // Once past the approval, a restart loses the result of a call with side effects.
        restored.handle_tool_awaiting_approval(1, "wait", false);
        let json = serde_json::to_string(restored.checkpoint()).unwrap();
        let mut again = Session::restore(
            serde_json::from_str(&json).unwrap(),
            restored.queue().to_vec(),
            3,
        );
        again.handle_resume(Millis(11));
        let effects: Vec<_> = std::iter::from_fn(|| again.poll_effect()).collect();
        assert!(
            effects
                .iter()
                .any(|e| matches!(e, crate::session::Effect::AppendEntry(entry)
                if serde_json::to_string(entry).unwrap().contains("result lost"))),
            "{effects:?}"
        );
        // The mark goes with the call's result, and with stop.
        let mut s = session();
        enqueue(&mut s, "a", Lane::FollowUp, "bob");
        s.handle_inference_done(Millis(3), 1, Ok(tool_message(vec![call("w", "bash")])));
        s.handle_tool_awaiting_approval(1, "w", true);
        s.handle_tool_done(Millis(4), 1, "w", "x".into(), true);
        assert!(s.checkpoint().awaiting_approval.is_empty());
        enqueue(&mut s, "b", Lane::FollowUp, "bob");
        s.handle_inference_done(Millis(5), 2, Ok(text_message("ok")));
        s.handle_inference_done(Millis(6), 3, Ok(tool_message(vec![call("v", "bash")])));
        s.handle_tool_awaiting_approval(3, "v", true);
        s.handle_stop(Millis(7), "alice");
        assert!(s.checkpoint().awaiting_approval.is_empty());
    }
    #[test]
    fn pending_requests_are_those_without_a_decision() {
        let custom = |cursor: u64, custom_type: &str, id: &str| Entry {
            cursor,
            id: format!("e{cursor}"),
            created_at: 0,
            payload: EntryPayload::Custom {
                custom_type: custom_type.into(),
                data: serde_json::json!({"approvalId": id}),
            },
        };
        let request = |c: u64, id: &'static str| custom(c, custom_types::APPROVAL_REQUESTED, id);
        let decision = |c: u64, id: &'static str| custom(c, custom_types::APPROVAL_DECIDED, id);
        let other = |c: u64| Entry {
            cursor: c,
            id: format!("e{c}"),
            created_at: 0,
            payload: EntryPayload::Custom {
                custom_type: custom_types::LLM_ERROR.into(),
                data: serde_json::json!({"approvalId": "a"}),
            },
        };
        // (transcript, pending ids in order)
        let cases: Vec<(Vec<Entry>, Vec<&str>)> = vec![
            (vec![], vec![]),
            (vec![other(1)], vec![]),
            (vec![request(1, "a")], vec!["a"]),
            (vec![request(1, "a"), decision(2, "a")], vec![]),
            (
                vec![request(1, "a"), request(2, "b"), decision(3, "a")],
                vec!["b"],
            ),
            (
                vec![request(1, "a"), other(2), request(3, "b")],
                vec!["a", "b"],
            ),
            // A decision of another approval leaves this one waiting.
            (vec![request(1, "a"), decision(2, "z")], vec!["a"]),
            // Another entry naming the id decides nothing.
            (vec![request(1, "a"), other(2)], vec!["a"]),
        ];
        for (entries, want) in cases {
            let got: Vec<&str> = pending_requests(&entries)
                .iter()
                .map(|d| d["approvalId"].as_str().unwrap())
                .collect();
            assert_eq!(got, want, "{entries:?}");
        }
    }

    #[test]
    fn people_read_who_asks_what_where_and_exactly_what_would_run() {
        let target = Target {
            runner: "mac",
            runner_owner: "alice",
            runner_kind: RunnerKind::Local,
            policy: ApprovalPolicy::Auto,
        };
        let run = Action::Run {
            tool: "bash",
            environment: "api",
        };
        let cases: Vec<(Vec<String>, Option<&Target<'_>>, &str)> = vec![
            (
                vec!["bob".into()],
                Some(&target),
                "bob asks to run bash on environment \"api\" on alice's local runner \"mac\".",
            ),
            (
                vec!["bob".into(), "cy".into()],
                None,
                "bob, cy ask to run bash on environment \"api\".",
            ),
            (
                vec![],
                Some(&target),
                "This session (nobody prompted it) asks to run bash on environment \"api\" on alice's local runner \"mac\".",
            ),
        ];
        for (authors, target, want) in cases {
            assert_eq!(people_text(&run, target, &authors), want);
        }

        let summary = "bob asks to run bash.";
        // (data, card)
        let long = "x".repeat(CARD_DETAIL_CHARS + 5);
        let cases = vec![
            (
                serde_json::json!({"summary": summary, "command": "cargo test", "text": "Answer with POST …"}),
                format!("{summary}\n```\ncargo test\n```"),
            ),
            (
                serde_json::json!({"summary": summary, "diff": "-a\n+b"}),
                format!("{summary}\n```\n-a\n+b\n```"),
            ),
            (serde_json::json!({"summary": summary}), summary.to_string()),
            (
                serde_json::json!({"summary": summary, "command": ""}),
                summary.to_string(),
            ),
            // Older requests have only the model's text.
            (
                serde_json::json!({"text": "Approval needed from alice"}),
                "Approval needed from alice".to_string(),
            ),
            (serde_json::json!({}), "An approval is needed.".to_string()),
            // A fence the command cannot close.
            (
                serde_json::json!({"summary": summary, "command": "echo ```; ls"}),
                format!("{summary}\n````\necho ```; ls\n````"),
            ),
            (
                serde_json::json!({"summary": summary, "command": long}),
                format!("{summary}\n```\n{}…\n```", "x".repeat(CARD_DETAIL_CHARS)),
            ),
        ];
        for (data, want) in cases {
            assert_eq!(card_text(&data), want, "{data}");
        }
    }
}
