//! Who may do what inside a tenant.
//!
//! Tenants are isolated by construction (actor names, key prefixes, one hub per tenant). Inside a
//! tenant these rules decide, for a verified [`Principal`]:
//!
//! * tokens: which claims are acceptable ([`check_claims`], [`check_secret`]);
//! * sessions: an owner (the first user who prompts it, until then its creator) and an
//!   [`Access`] (`private` or `tenant`); see [`session_allows`];
//! * the workspace: `users/<sub>/…` belongs to `<sub>`, `config/…` to admins
//!   ([`may_write_workspace`]);
//! * environment definitions belong to their creator ([`may_edit_definition`]);
//! * runners belong to their token's `sub`, and are `cloud` only by a token claim
//!   ([`runner_kind_from_claims`]); work that reaches a person's local runner on someone else's
//!   prompt waits for that person ([`runner_owner_must_approve`]).
//!
//! `docs/security.md` has the same rules as one table. Every function here is pure.

use serde::{Deserialize, Serialize};

use crate::wire::Claims;
use crate::wire::runner::RunnerKind;

/// A person's role in their tenant (token claim `role`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// May do everything in the tenant.
    Admin,
    /// May do what the rules below allow (the default).
    #[default]
    Member,
}

impl Role {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Member => "member",
        }
    }

    /// Parses the wire name.
    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "admin" => Some(Role::Admin),
            "member" => Some(Role::Member),
            _ => None,
        }
    }

    /// The lesser of two roles: a credential acts with no more than what each of its
    /// sources grants (its claim, and what its lineage's root grants now).
    pub fn at_most(self, other: Role) -> Role {
        if self == Role::Admin && other == Role::Admin {
            Role::Admin
        } else {
            Role::Member
        }
    }

    /// Whether this role grants everything `other` grants.
    pub fn covers(self, other: Role) -> bool {
        self == Role::Admin || other == Role::Member
    }
}

/// Who may see and prompt a session.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Access {
    /// Only the owner, the creator and admins (the default).
    #[default]
    Private,
    /// Every member of the tenant may read and prompt it: a group chat.
    Tenant,
}

impl Access {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Private => "private",
            Access::Tenant => "tenant",
        }
    }
}

/// A verified identity: who is asking, in which tenant, with which role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// The token's `sub`: a username.
    pub sub: String,
    /// The token's tenant.
    pub tenant: String,
    /// The token's role.
    pub role: Role,
}

impl Principal {
    /// Whether this principal is an admin of its tenant.
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }
}

// ---------------------------------------------------------------------------------------------
// Tokens

/// Shortest accepted `WUHU_JWT_SECRET`, in bytes (HS256 wants at least the hash size).
pub const MIN_SECRET_BYTES: usize = 32;
/// Longest `sub` or `tenant`, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Default longest lifetime of a user token (`exp - now`), in seconds: 90 days.
pub const DEFAULT_MAX_USER_TOKEN_SECS: i64 = 90 * 86_400;
/// Default longest lifetime of a runner token, in seconds: 400 days.
pub const DEFAULT_MAX_RUNNER_TOKEN_SECS: i64 = 400 * 86_400;

/// Whether `name` is an acceptable `sub` or `tenant`: 1–128 bytes of `A-Z a-z 0-9 _ . @ + -`,
/// and not `.` or `..`. Both become header values, Durable Object names and workspace path
/// segments, so nothing else is allowed.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'@' | b'+' | b'-'))
        && name != "."
        && name != ".."
}

/// Why the server's secret is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    /// The variable is not set.
    #[error("WUHU_JWT_SECRET is not set")]
    Missing,
    /// The variable is shorter than [`MIN_SECRET_BYTES`].
    #[error("WUHU_JWT_SECRET must be at least {MIN_SECRET_BYTES} bytes (it has {0})")]
    TooShort(usize),
}

/// Refuses a missing, empty or short secret: a server with a weak secret must not work at all.
///
/// # Errors
/// A [`SecretError`] naming the variable.
pub fn check_secret(secret: Option<&str>) -> Result<(), SecretError> {
    match secret {
        None => Err(SecretError::Missing),
        Some(s) if s.len() < MIN_SECRET_BYTES => Err(SecretError::TooShort(s.len())),
        Some(_) => Ok(()),
    }
}

/// Which kind of token a route accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// A person's token (no `typ`, or any `typ` but `runner`).
    User,
    /// A runner's token (`typ: runner`).
    Runner,
}

/// Limits on token lifetimes, from server configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenLimits {
    /// Longest `exp - now` of a user token, in seconds.
    pub max_user_secs: i64,
    /// Longest `exp - now` of a runner token, in seconds.
    pub max_runner_secs: i64,
}

impl Default for TokenLimits {
    fn default() -> Self {
        TokenLimits {
            max_user_secs: DEFAULT_MAX_USER_TOKEN_SECS,
            max_runner_secs: DEFAULT_MAX_RUNNER_TOKEN_SECS,
        }
    }
}

/// What a token grants once its claims are accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Who.
    pub principal: Principal,
    /// For runner tokens: the kind of runner it may be (`local` unless the token says `cloud`).
    pub runner_kind: Option<RunnerKind>,
}

/// Why claims were refused (the message of a 401).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimsError {
    /// A runner token on a user route.
    #[error("runner tokens cannot call the user api")]
    RunnerTokenOnUserRoute,
    /// A user token on the runner route.
    #[error("a runner token is required")]
    UserTokenOnRunnerRoute,
    /// `sub` or `tenant` is malformed.
    #[error("token must name a sub and a tenant (1-128 of A-Z a-z 0-9 _ . @ + -)")]
    BadName,
    /// `role` is not `admin` or `member`.
    #[error("token role must be admin or member")]
    BadRole,
    /// `exp` is further in the future than the configured maximum.
    #[error("token lifetime exceeds the maximum of {0} days")]
    TooLong(i64),
    /// `exp` is in the past.
    #[error("token expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("token not valid yet")]
    NotYetValid,
    /// `runnerKind` on a user token, or an unknown value.
    #[error("runnerKind is only allowed on runner tokens, as local or cloud")]
    BadRunnerKind,
}

/// Checks claims whose signature is already verified. `now` is unix seconds.
///
/// # Errors
/// A [`ClaimsError`] for the first rule broken.
pub fn check_claims(
    claims: &Claims,
    kind: TokenKind,
    now: i64,
    limits: TokenLimits,
) -> Result<Grant, ClaimsError> {
    let is_runner = claims.typ.as_deref() == Some("runner");
    match (kind, is_runner) {
        (TokenKind::User, true) => return Err(ClaimsError::RunnerTokenOnUserRoute),
        (TokenKind::Runner, false) => return Err(ClaimsError::UserTokenOnRunnerRoute),
        _ => {}
    }
    if !valid_name(&claims.sub) || !valid_name(&claims.tenant) {
        return Err(ClaimsError::BadName);
    }
    if claims.exp <= now {
        return Err(ClaimsError::Expired);
    }
    if claims.nbf.is_some_and(|nbf| nbf > now) {
        return Err(ClaimsError::NotYetValid);
    }
    let max = if is_runner {
        limits.max_runner_secs
    } else {
        limits.max_user_secs
    };
    if claims.exp - now > max {
        return Err(ClaimsError::TooLong(max / 86_400));
    }
    let role = match claims.role.as_deref() {
        None => Role::Member,
        Some(text) => Role::parse(text).ok_or(ClaimsError::BadRole)?,
    };
    let runner_kind = match (is_runner, claims.runner_kind.as_deref()) {
        (false, None) => None,
        (false, Some(_)) => return Err(ClaimsError::BadRunnerKind),
        (true, None | Some("local")) => Some(RunnerKind::Local),
        (true, Some("cloud")) => Some(RunnerKind::Cloud),
        (true, Some(_)) => return Err(ClaimsError::BadRunnerKind),
    };
    Ok(Grant {
        principal: Principal {
            sub: claims.sub.clone(),
            tenant: claims.tenant.clone(),
            role,
        },
        runner_kind,
    })
}

/// The kind a runner is, whatever its `hello` says: its token decides.
pub fn runner_kind_from_claims(token_kind: Option<RunnerKind>) -> RunnerKind {
    token_kind.unwrap_or(RunnerKind::Local)
}

// ---------------------------------------------------------------------------------------------
// Sessions

/// The authority-relevant facts of one session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionFacts<'a> {
    /// Its owner: the first user who prompted it, until then its creator.
    pub owner: &'a str,
    /// Its creator.
    pub created_by: &'a str,
    /// Who may see and prompt it.
    pub access: Access,
}

/// Whether a session's own tool may do `action` to it (`set_model`, js
/// `wuhu.session.setModel`): only when every person the current turn acts for (`turn_authors`)
/// may do it through the API, as a member of `tenant`: a tool never has more than they have.
/// A turn that acts for nobody (started by the system lane) may not.
pub fn turn_allows(
    tenant: &str,
    turn_authors: &[String],
    session: SessionFacts<'_>,
    action: SessionAction<'_>,
) -> bool {
    !turn_authors.is_empty()
        && turn_authors.iter().all(|author| {
            let who = Principal {
                sub: author.clone(),
                tenant: tenant.to_string(),
                role: Role::Member,
            };
            session_allows(&who, session, action) == Verdict::Allow
        })
}

/// Whether `sub` is a guest: a chat platform's user no admin mapped to a person of the tenant
/// (`<platform>:<id>`: a token's `sub` cannot hold a `:`, [`valid_name`]), or the principals
/// past a turn's bound (`session::MORE_PRINCIPALS`, who could be anyone). A guest may see only
/// the sessions it started, never a member's.
pub fn is_guest(sub: &str) -> bool {
    sub.contains(':') || sub == crate::session::MORE_PRINCIPALS
}

/// The one member a turn acting for `acting_for` acts for alone, if it does: whose own MCP
/// servers and OAuth connections the turn may use (`crate::mcp_client`; they can hold what only
/// that person may see, and a turn for several people would hand it to the others).
pub fn sole_member(acting_for: &[String]) -> Option<&str> {
    match acting_for {
        [one] if !is_guest(one) => Some(one.as_str()),
        _ => None,
    }
}

/// The workspace folder of a chat binding's guests: `channels/<binding id>/`.
pub fn guest_folder(binding: &str) -> String {
    format!("channels/{binding}/")
}

/// What a session's tools may reach in the current turn: what the people it acts for may
/// reach, and only a guest's share when any of them is a guest (decision 0035).
///
/// A turn is a guest's when a guest is among the people it acts for (a chat user no admin
/// mapped, or the marker past a turn's bound, who could be anyone), or when it acts for
/// nobody (the system lane: a child's report, a finished job) in a session a guest owns or
/// created, or in a chat session: what a guest caused there must not come back with more
/// than a guest's rights. A child's task carries the parent turn's set, so a child spawned in
/// a guest's turn is a guest's too, and a child carries its parent's binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TurnRights {
    /// The people's own rights (the other rules decide: approvals, [`ToolReaders`],
    /// [`WorkspaceWriter`]).
    People,
    /// A guest's: no runner of any kind, no js egress, the workspace only under
    /// `folder` (none when the session knows no binding), and other sessions only as
    /// [`ToolReaders`] lets guests (those they started).
    Guest {
        /// Who makes it a guest's turn (for the error the agent sees): the first guest it
        /// acts for, else the session's owner or `nobody`.
        guest: String,
        /// `channels/<binding id>/`, when the session knows its binding.
        folder: Option<String>,
    },
}

impl TurnRights {
    /// The rights of a turn acting for `acting_for` in a session owned by `owner`, created
    /// by `created_by`, made by chat binding `channel` (or by a session that was).
    pub fn of_turn(
        acting_for: &[String],
        owner: &str,
        created_by: &str,
        channel: Option<&str>,
    ) -> TurnRights {
        let guest = match acting_for.iter().find(|sub| is_guest(sub)) {
            Some(guest) => Some(guest.clone()),
            None if acting_for.is_empty() => [owner, created_by]
                .into_iter()
                .find(|sub| is_guest(sub))
                .map(str::to_string)
                .or_else(|| {
                    channel
                        .map(|_| "nobody (a turn the system started in a chat session)".to_string())
                }),
            None => None,
        };
        match guest {
            None => TurnRights::People,
            Some(guest) => TurnRights::Guest {
                guest,
                folder: channel.map(guest_folder),
            },
        }
    }

    /// Whether this is a guest's turn.
    pub fn is_guest(&self) -> bool {
        matches!(self, TurnRights::Guest { .. })
    }

    /// Whether the turn may use a runner (request, attach, share, or run a tool on one).
    ///
    /// # Errors
    /// The tool error the agent sees, saying why.
    pub fn may_use_runners(&self) -> Result<(), String> {
        match self {
            TurnRights::People => Ok(()),
            TurnRights::Guest { guest, .. } => Err(format!(
                "Refused: this turn acts for the chat guest {guest}, and guests may not use environments or runners (local or cloud). Answer without one; an admin can map the person to a Wuhu account to give them a member's rights."
            )),
        }
    }

    /// Whether the turn may make HTTP requests from js (`fetch`).
    ///
    /// # Errors
    /// The error the script sees.
    pub fn may_fetch(&self) -> Result<(), String> {
        match self {
            TurnRights::People => Ok(()),
            TurnRights::Guest { guest, .. } => Err(format!(
                "egress refused: this turn acts for the chat guest {guest}, and guests' scripts have no network access"
            )),
        }
    }

    /// Whether the turn may use MCP servers (`mcp_tools`, `mcp_call`, js `wuhu.mcp.*`,
    /// `wuhu://mcp/`): the tenant's servers reach its systems with its credentials.
    ///
    /// # Errors
    /// The tool error the agent sees.
    pub fn may_use_mcp(&self) -> Result<(), String> {
        match self {
            TurnRights::People => Ok(()),
            TurnRights::Guest { guest, .. } => Err(format!(
                "Refused: this turn acts for the chat guest {guest}, and guests may not use the tenant's MCP servers; an admin can map the person to a Wuhu account to give them a member's rights."
            )),
        }
    }

    /// Whether the turn may read the tenant's settings (`wuhu://config/`).
    pub fn may_read_config(&self) -> bool {
        !self.is_guest()
    }

    /// Whether the turn may read the workspace document `path` (normalised), or list under it
    /// when it is a prefix: a guest's turn only inside its folder.
    ///
    /// # Errors
    /// The tool error the agent sees.
    pub fn may_read_workspace(&self, path: &str) -> Result<(), String> {
        match self {
            TurnRights::People => Ok(()),
            TurnRights::Guest { guest, folder } => match folder {
                Some(folder)
                    if crate::workspace::normalize_prefix(path)
                        .is_ok_and(|path| path.starts_with(folder.as_str())) =>
                {
                    Ok(())
                }
                Some(folder) => Err(format!(
                    "Refused: this turn acts for the chat guest {guest}, who may read only wuhu://workspace/{folder}."
                )),
                None => Err(format!(
                    "Refused: this turn acts for the chat guest {guest}, who may not read the workspace."
                )),
            },
        }
    }
}

/// Whether `sub`, as a member of `tenant` (a session's tools never act as admins) or as a guest,
/// may read a session.
fn principal_may_read(tenant: &str, sub: &str, session: SessionFacts<'_>) -> bool {
    if is_guest(sub) {
        return sub == session.owner || sub == session.created_by;
    }
    let who = Principal {
        sub: sub.to_string(),
        tenant: tenant.to_string(),
        role: Role::Member,
    };
    session_allows(&who, session, SessionAction::Read) == Verdict::Allow
}

/// Whom a session's tools read other sessions for (`list_sessions`, `read_session`, js
/// `wuhu.sessions.list/get`): what a turn may see is what every person it acts for may see
/// through the API, never more.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ToolReaders {
    /// These people (at least one): a session is seen only when every one of them may read
    /// it.
    People(Vec<String>),
    /// Nobody (a turn the system started, or one whose people are unknown): only the
    /// session's own children, by the session's id.
    Lineage(String),
}

impl ToolReaders {
    /// The readers of a turn of session `session_id` that acts for `acting_for`.
    pub fn of_turn(session_id: &str, acting_for: &[String]) -> ToolReaders {
        if acting_for.is_empty() {
            ToolReaders::Lineage(session_id.to_string())
        } else {
            ToolReaders::People(acting_for.to_vec())
        }
    }

    /// Whether these readers may see a session of `tenant` with `facts`, whose parent is
    /// `parent_id`.
    pub fn may_read(&self, tenant: &str, facts: SessionFacts<'_>, parent_id: Option<&str>) -> bool {
        match self {
            ToolReaders::People(people) => {
                !people.is_empty()
                    && people
                        .iter()
                        .all(|sub| principal_may_read(tenant, sub, facts))
            }
            ToolReaders::Lineage(session) => parent_id == Some(session.as_str()),
        }
    }
}

/// Something a person may try to do to a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAction<'a> {
    /// Read its transcript, follow it, see it listed, see its stats.
    Read,
    /// Enqueue a message on a public lane.
    Prompt,
    /// Cancel a queued item enqueued by `author`.
    CancelItem {
        /// Who enqueued the item.
        author: &'a str,
    },
    /// Stop the running turn.
    Stop,
    /// Change its title.
    Rename,
    /// Change its access.
    ChangeAccess,
    /// Delete it (`DELETE /v1/sessions/:id`): its owner or an admin only, not its creator once
    /// someone else owns it (decision 0017).
    Delete,
}

/// What the rules say about an action.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead.
    Allow,
    /// Answer 404: the session's existence is not revealed.
    Hidden,
    /// Answer 403: the person sees the session but may not do this.
    Forbidden,
}

/// Whether `who` may do `action` to a session. Owners, creators and admins may do everything;
/// in a `tenant` session every member may read, prompt and cancel their own queued items; a
/// private session is invisible to everyone else.
pub fn session_allows(
    who: &Principal,
    session: SessionFacts<'_>,
    action: SessionAction<'_>,
) -> Verdict {
    let privileged = who.is_admin() || who.sub == session.owner || who.sub == session.created_by;
    if action == SessionAction::Delete {
        return if who.is_admin() || who.sub == session.owner {
            Verdict::Allow
        } else if privileged || session.access == Access::Tenant {
            Verdict::Forbidden
        } else {
            Verdict::Hidden
        };
    }
    if privileged {
        return Verdict::Allow;
    }
    if session.access == Access::Private {
        return Verdict::Hidden;
    }
    match action {
        SessionAction::Read | SessionAction::Prompt => Verdict::Allow,
        SessionAction::CancelItem { author } if author == who.sub => Verdict::Allow,
        SessionAction::CancelItem { .. }
        | SessionAction::Stop
        | SessionAction::Rename
        | SessionAction::ChangeAccess
        | SessionAction::Delete => Verdict::Forbidden,
    }
}

/// The owner after `author`'s message is delivered: the first prompter becomes the owner.
/// `prompted` says whether any user message was delivered before.
pub fn owner_after_prompt<'a>(owner: &'a str, prompted: bool, author: &'a str) -> &'a str {
    if prompted { owner } else { author }
}

// ---------------------------------------------------------------------------------------------
// Workspace, definitions, runners

/// Whether `path` (normalised) is one of the tenant's settings (`config/…`: the model table
/// `config/models.json`, `config/tenant.json`): they change prices, budgets' meaning and what
/// is logged, so only admins write them.
pub fn is_tenant_config(path: &str) -> bool {
    path == "config" || path.starts_with("config/")
}

/// Whether `who` may create, change or delete the workspace document at `path` (normalised).
/// `users/<sub>/…` is writable only by `<sub>` and admins, `config/…` only by admins;
/// everything else is tenant-wide.
pub fn may_write_workspace(who: &Principal, path: &str) -> bool {
    if is_tenant_config(path) {
        return who.is_admin();
    }
    match path.strip_prefix("users/") {
        None => true,
        Some(rest) => {
            let user = rest.split('/').next().unwrap_or_default();
            who.is_admin() || user == who.sub
        }
    }
}

/// Who changes a workspace document.
#[derive(Clone, Copy, Debug)]
pub enum WorkspaceWriter<'a> {
    /// A person, through the API.
    Person(&'a Principal),
    /// A session's tool (`write`, js `wuhu.workspace.*`).
    SessionTool {
        /// The session's owner.
        owner: &'a str,
        /// The authors of the current turn's messages.
        turn_authors: &'a [String],
        /// The turn's rights: a guest's turn writes only inside its folder.
        rights: &'a TurnRights,
    },
}

impl WorkspaceWriter<'_> {
    /// Whether this writer may change `path` (normalised). A person: see
    /// [`may_write_workspace`]. A session's tool writes tenant-wide paths except `config/…`,
    /// and `users/<owner>/…` only while nobody but the owner wrote the current turn's
    /// messages: a member prompting someone's group session cannot plant text in that
    /// person's context document. A guest's turn writes only inside its folder
    /// (`channels/<binding id>/`, [`TurnRights`]).
    pub fn may_write(&self, path: &str) -> bool {
        match self {
            WorkspaceWriter::Person(who) => may_write_workspace(who, path),
            WorkspaceWriter::SessionTool { .. }
                if is_tenant_config(path)
                    || crate::policy::is_policy_document(path)
                    || crate::mcp_client::documents::is_mcp_document(path) =>
            {
                false
            }
            WorkspaceWriter::SessionTool {
                rights: TurnRights::Guest { folder, .. },
                ..
            } => folder
                .as_deref()
                .is_some_and(|folder| path.starts_with(folder)),
            WorkspaceWriter::SessionTool {
                owner,
                turn_authors,
                ..
            } => {
                let owner_alone = turn_authors.iter().all(|a| a == owner);
                match path.strip_prefix("users/") {
                    None => true,
                    Some(rest) => owner_alone && rest.split('/').next() == Some(*owner),
                }
            }
        }
    }
}

impl WorkspaceWriter<'_> {
    /// Why this writer may not change `path` (the message of its 403).
    pub fn refusal(&self, path: &str) -> String {
        match self {
            _ if is_tenant_config(path) => {
                format!("the tenant's settings: only an admin may change {path}")
            }
            WorkspaceWriter::SessionTool { .. } if crate::policy::is_policy_document(path) => {
                format!(
                    "{path} is a policy: a session's tools never change the rules it runs under; its user or an admin edits it"
                )
            }
            WorkspaceWriter::SessionTool { .. }
                if crate::mcp_client::documents::is_mcp_document(path) =>
            {
                format!(
                    "{path} lists MCP servers: a session's tools never change where its calls (and their credentials) go; its user or an admin edits it"
                )
            }
            WorkspaceWriter::SessionTool {
                rights: TurnRights::Guest { guest, folder },
                ..
            } => match folder {
                Some(folder) => format!(
                    "this turn acts for the chat guest {guest}, who may change only wuhu://workspace/{folder}"
                ),
                None => format!(
                    "this turn acts for the chat guest {guest}, who may not change the workspace"
                ),
            },
            _ => format!("only its owner or an admin may change {path}"),
        }
    }
}

/// Whether `who` may change or delete an environment definition owned by `owner`.
pub fn may_edit_definition(who: &Principal, owner: &str) -> bool {
    who.is_admin() || who.sub == owner
}

/// Whether `who` may free the runner name `owner` holds (`DELETE /v1/runners/:owner/:name`:
/// the row goes, and a live connection of it is refused for good). Runners are listed
/// tenant-wide, so anyone else is told no (403), not that it does not exist.
pub fn may_free_runner_name(who: &Principal, owner: &str) -> bool {
    who.is_admin() || who.sub == owner
}

/// Whether a `local` or `worktree` definition by `who` may name a runner owned by
/// `runner_owner` (of kind `runner_kind`). Admins may name any runner; others only their own
/// or a cloud runner.
pub fn may_name_runner(who: &Principal, runner_owner: &str, runner_kind: RunnerKind) -> bool {
    who.is_admin() || who.sub == runner_owner || runner_kind == RunnerKind::Cloud
}

/// Whether a tool call must wait for the runner owner's approval: it runs on (or attaches) an
/// environment served by a local runner whose owner is not the author of the message that
/// started the current turn, and the owner has not approved this session yet.
pub fn runner_owner_must_approve(
    runner_kind: RunnerKind,
    runner_owner: &str,
    turn_author: &str,
    approved_for_session: bool,
) -> bool {
    runner_kind == RunnerKind::Local && runner_owner != turn_author && !approved_for_session
}

/// Who may answer an approval request.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "kind", content = "sub", rename_all = "camelCase")]
pub enum Approver {
    /// Only this runner owner (or an admin): work reaching their machine on someone else's prompt.
    RunnerOwner(String),
    /// The session's owner (or an admin): a definition's `approval: ask`.
    SessionOwner(String),
}

/// Whether `who` may answer an approval addressed to `approver`.
pub fn may_answer_approval(who: &Principal, approver: &Approver) -> bool {
    who.is_admin()
        || match approver {
            Approver::RunnerOwner(sub) | Approver::SessionOwner(sub) => *sub == who.sub,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a session's tools see for the people a turn acts for: the intersection of what
    /// each may read, guests see only what they started, a turn for nobody only its children.
    #[test]
    fn tool_readers_see_what_every_person_they_act_for_may_read() {
        let facts = |owner: &'static str, access: Access| SessionFacts {
            owner,
            created_by: owner,
            access,
        };
        let alice_private = (facts("alice", Access::Private), None);
        let alice_group = (facts("alice", Access::Tenant), None);
        let carol_private = (facts("carol", Access::Private), None);
        let guest_thread = (facts("slack:U1", Access::Tenant), None);
        let child_of_s = (facts("alice", Access::Private), Some("s"));
        let people =
            |subs: &[&str]| ToolReaders::People(subs.iter().map(|s| s.to_string()).collect());
        let cases: Vec<(ToolReaders, [bool; 5])> = vec![
            // alice_private, alice_group, carol_private, guest_thread, child_of_s
            (people(&["alice"]), [true, true, false, true, true]),
            (people(&["bob"]), [false, true, false, true, false]),
            (people(&["alice", "bob"]), [false, true, false, true, false]),
            (people(&["bob", "alice"]), [false, true, false, true, false]),
            (people(&["slack:U1"]), [false, false, false, true, false]),
            (
                people(&["alice", "slack:U1"]),
                [false, false, false, true, false],
            ),
            (
                people(&["alice", crate::session::MORE_PRINCIPALS]),
                [false; 5],
            ),
            (people(&[]), [false; 5]),
            (
                ToolReaders::Lineage("s".into()),
                [false, false, false, false, true],
            ),
            (
                ToolReaders::of_turn("s", &[]),
                [false, false, false, false, true],
            ),
        ];
        for (readers, want) in cases {
            let got: Vec<bool> = [
                alice_private,
                alice_group,
                carol_private,
                guest_thread,
                child_of_s,
            ]
            .iter()
            .map(|(f, parent)| readers.may_read("acme", *f, *parent))
            .collect();
            assert_eq!(got, want, "{readers:?}");
        }
        assert!(is_guest("telegram:42") && is_guest("*"));
        assert!(!is_guest("alice") && !valid_name("slack:U1") && !valid_name("*"));
    }

    /// A turn that acts for a guest (or, in a chat session or a guest's, for nobody) gets a
    /// guest's share: no runner, no egress, no settings, the workspace only in its binding's
    /// folder; a turn of people only keeps their rights, whoever owns the session.
    #[test]
    fn a_guests_turn_gets_a_guests_share() {
        let set = |subs: &[&str]| subs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        /// Acting for, owner, created by, channel, and the guest it names (`None`: people).
        type Case<'a> = (
            Vec<String>,
            &'a str,
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
        );
        let cases: [Case; 9] = [
            (set(&["alice"]), "alice", "alice", Some("b1"), None),
            (set(&["alice", "bob"]), "alice", "alice", None, None),
            (set(&["bob"]), "telegram:7", "telegram:7", Some("b1"), None),
            (
                set(&["alice", "telegram:7"]),
                "alice",
                "alice",
                Some("b1"),
                Some("telegram:7"),
            ),
            (set(&["alice", "*"]), "alice", "alice", None, Some("*")),
            (
                set(&[]),
                "telegram:7",
                "telegram:7",
                None,
                Some("telegram:7"),
            ),
            (set(&[]), "alice", "slack:U1", None, Some("slack:U1")),
            (set(&[]), "alice", "alice", Some("b1"), Some("nobody")),
            (set(&[]), "alice", "alice", None, None),
        ];
        for (acting_for, owner, created_by, channel, guest) in cases {
            let rights = TurnRights::of_turn(&acting_for, owner, created_by, channel);
            let what = format!("{acting_for:?} {owner} {created_by} {channel:?}");
            match (guest, &rights) {
                (None, TurnRights::People) => {
                    assert!(rights.may_use_runners().is_ok(), "{what}");
                    assert!(rights.may_fetch().is_ok(), "{what}");
                    assert!(rights.may_use_mcp().is_ok(), "{what}");
                    assert!(rights.may_read_config(), "{what}");
                    assert!(rights.may_read_workspace("users/alice/context.md").is_ok());
                }
                (Some(name), TurnRights::Guest { guest, folder }) => {
                    assert!(guest.starts_with(name), "{what}: {guest}");
                    assert_eq!(folder.as_deref(), channel.map(|_| "channels/b1/"), "{what}");
                    assert!(
                        rights.may_use_runners().unwrap_err().contains(name),
                        "{what}"
                    );
                    assert!(rights.may_fetch().unwrap_err().contains("egress refused"));
                    // A chat stranger's turn uses none of the tenant's MCP servers.
                    assert!(
                        rights.may_use_mcp().unwrap_err().contains("MCP servers"),
                        "{what}"
                    );
                    assert!(!rights.may_read_config(), "{what}");
                }
                _ => panic!("{what}: {rights:?}"),
            }
        }
        let guest = TurnRights::of_turn(&set(&["telegram:7"]), "alice", "alice", Some("b1"));
        let homeless = TurnRights::of_turn(&set(&["telegram:7"]), "alice", "alice", None);
        // (path, the guest of binding b1 may read it, may write it)
        let paths = [
            ("channels/b1/notes.md", true, true),
            ("channels/b1/", true, false),
            ("./channels/b1/a/b.md", true, true),
            ("channels/b1", false, false),
            ("channels/b10/notes.md", false, false),
            ("channels/b2/notes.md", false, false),
            ("users/alice/context.md", false, false),
            ("users/telegram:7/context.md", false, false),
            ("notes/a.md", false, false),
            ("config/tenant.json", false, false),
            ("", false, false),
        ];
        for (path, read, write) in paths {
            assert_eq!(guest.may_read_workspace(path).is_ok(), read, "{path}");
            assert!(homeless.may_read_workspace(path).is_err(), "{path}");
            let writer = WorkspaceWriter::SessionTool {
                owner: "alice",
                turn_authors: &[],
                rights: &guest,
            };
            // Writers get normalised document paths.
            if let Ok(doc) = crate::workspace::normalize_doc_path(path) {
                assert_eq!(writer.may_write(&doc), write, "{path}");
                let nowhere = WorkspaceWriter::SessionTool {
                    owner: "alice",
                    turn_authors: &[],
                    rights: &homeless,
                };
                assert!(!nowhere.may_write(&doc), "{path}");
                if !write {
                    assert!(
                        writer.refusal(&doc).contains("telegram:7") || doc.starts_with("config")
                    );
                }
            }
        }
        assert!(
            guest
                .may_read_workspace("users/alice/context.md")
                .unwrap_err()
                .contains("wuhu://workspace/channels/b1/")
        );
    }

    fn user(sub: &str, role: Role) -> Principal {
        Principal {
            sub: sub.into(),
            tenant: "acme".into(),
            role,
        }
    }

    #[test]
    fn names() {
        let cases = [
            ("alice", true),
            ("alice@my-mac", true),
            ("a.b+c_d-e", true),
            ("", false),
            (".", false),
            ("..", false),
            ("a/b", false),
            ("a b", false),
            ("a\r\nb", false),
            ("é", false),
        ];
        for (name, ok) in cases {
            assert_eq!(valid_name(name), ok, "{name:?}");
        }
        assert!(valid_name(&"x".repeat(128)));
        assert!(!valid_name(&"x".repeat(129)));
    }

    #[test]
    fn secrets() {
        assert_eq!(check_secret(None), Err(SecretError::Missing));
        assert_eq!(check_secret(Some("")), Err(SecretError::TooShort(0)));
        assert_eq!(check_secret(Some("abc")), Err(SecretError::TooShort(3)));
        assert_eq!(
            check_secret(Some(&"k".repeat(31))),
            Err(SecretError::TooShort(31))
        );
        assert_eq!(check_secret(Some(&"k".repeat(32))), Ok(()));
    }

    fn claims(json: serde_json::Value) -> Claims {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn claims_table() {
        let now = 1_000_000;
        let day = 86_400;
        let limits = TokenLimits::default();
        let user_token = |extra: serde_json::Value| {
            let mut base = serde_json::json!({"sub": "alice", "tenant": "acme", "exp": now + day});
            for (k, v) in extra.as_object().unwrap() {
                base[k] = v.clone();
            }
            claims(base)
        };
        use ClaimsError::*;
        use serde_json::json;
        type Case = (
            serde_json::Value,
            TokenKind,
            Result<(Role, Option<RunnerKind>), ClaimsError>,
        );
        let cases: Vec<Case> = vec![
            (json!({}), TokenKind::User, Ok((Role::Member, None))),
            (
                json!({"role": "admin"}),
                TokenKind::User,
                Ok((Role::Admin, None)),
            ),
            (
                json!({"role": "member"}),
                TokenKind::User,
                Ok((Role::Member, None)),
            ),
            (json!({"role": "root"}), TokenKind::User, Err(BadRole)),
            (
                json!({"typ": "runner"}),
                TokenKind::User,
                Err(RunnerTokenOnUserRoute),
            ),
            (json!({}), TokenKind::Runner, Err(UserTokenOnRunnerRoute)),
            (
                json!({"typ": "runner"}),
                TokenKind::Runner,
                Ok((Role::Member, Some(RunnerKind::Local))),
            ),
            (
                json!({"typ": "runner", "runnerKind": "cloud"}),
                TokenKind::Runner,
                Ok((Role::Member, Some(RunnerKind::Cloud))),
            ),
            (
                json!({"typ": "runner", "runnerKind": "local"}),
                TokenKind::Runner,
                Ok((Role::Member, Some(RunnerKind::Local))),
            ),
            (
                json!({"typ": "runner", "runnerKind": "gpu"}),
                TokenKind::Runner,
                Err(BadRunnerKind),
            ),
            (
                json!({"runnerKind": "cloud"}),
                TokenKind::User,
                Err(BadRunnerKind),
            ),
            (json!({"sub": ""}), TokenKind::User, Err(BadName)),
            (json!({"sub": "a\nb"}), TokenKind::User, Err(BadName)),
            (json!({"tenant": ".."}), TokenKind::User, Err(BadName)),
            (json!({"exp": now}), TokenKind::User, Err(Expired)),
            (json!({"nbf": now + 10}), TokenKind::User, Err(NotYetValid)),
            (
                json!({"nbf": now}),
                TokenKind::User,
                Ok((Role::Member, None)),
            ),
            (
                json!({"exp": now + 90 * day}),
                TokenKind::User,
                Ok((Role::Member, None)),
            ),
            (
                json!({"exp": now + 90 * day + 1}),
                TokenKind::User,
                Err(TooLong(90)),
            ),
            (
                json!({"typ": "runner", "exp": now + 400 * day}),
                TokenKind::Runner,
                Ok((Role::Member, Some(RunnerKind::Local))),
            ),
            (
                json!({"typ": "runner", "exp": now + 401 * day}),
                TokenKind::Runner,
                Err(TooLong(400)),
            ),
        ];
        for (extra, kind, want) in cases {
            let got = check_claims(&user_token(extra.clone()), kind, now, limits)
                .map(|g| (g.principal.role, g.runner_kind));
            assert_eq!(got, want, "{extra} as {kind:?}");
        }
    }

    #[test]
    fn session_table() {
        use SessionAction::*;
        use Verdict::*;
        let alice = user("alice", Role::Member);
        let bob = user("bob", Role::Member);
        let carol = user("carol", Role::Member);
        let admin = user("root", Role::Admin);
        let private = SessionFacts {
            owner: "alice",
            created_by: "carol",
            access: Access::Private,
        };
        let group = SessionFacts {
            access: Access::Tenant,
            ..private
        };
        let actions = [
            Read,
            Prompt,
            CancelItem { author: "bob" },
            CancelItem { author: "alice" },
            Stop,
            Rename,
            ChangeAccess,
            Delete,
        ];
        // Carol created the session and Alice owns it (she prompted first): Carol may do
        // everything but delete it.
        let cases: [(&Principal, SessionFacts<'_>, [Verdict; 8]); 8] = [
            (&alice, private, [Allow; 8]),
            (
                &carol,
                private,
                [Allow, Allow, Allow, Allow, Allow, Allow, Allow, Forbidden],
            ),
            (&admin, private, [Allow; 8]),
            (&bob, private, [Hidden; 8]),
            (&alice, group, [Allow; 8]),
            (
                &carol,
                group,
                [Allow, Allow, Allow, Allow, Allow, Allow, Allow, Forbidden],
            ),
            (&admin, group, [Allow; 8]),
            (
                &bob,
                group,
                [
                    Allow, Allow, Allow, Forbidden, Forbidden, Forbidden, Forbidden, Forbidden,
                ],
            ),
        ];
        for (who, facts, want) in cases {
            for (action, want) in actions.iter().zip(want) {
                assert_eq!(
                    session_allows(who, facts, *action),
                    want,
                    "{} {:?} {action:?}",
                    who.sub,
                    facts.access
                );
            }
        }
    }

    #[test]
    fn a_turn_may_do_what_everyone_it_acts_for_may() {
        let private = SessionFacts {
            owner: "alice",
            created_by: "carol",
            access: Access::Private,
        };
        let group = SessionFacts {
            access: Access::Tenant,
            ..private
        };
        let authors = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        // (session, turn authors, action, allowed)
        let cases = [
            (private, authors(&["alice"]), SessionAction::Prompt, true),
            (private, authors(&["carol"]), SessionAction::Prompt, true),
            (
                private,
                authors(&["alice", "bob"]),
                SessionAction::Prompt,
                false,
            ),
            (private, authors(&["bob"]), SessionAction::Prompt, false),
            (private, authors(&[]), SessionAction::Prompt, false),
            (group, authors(&["bob"]), SessionAction::Prompt, true),
            (
                group,
                authors(&["alice", "bob"]),
                SessionAction::Prompt,
                true,
            ),
            (group, authors(&[]), SessionAction::Prompt, false),
            (group, authors(&["bob"]), SessionAction::Rename, false),
            (group, authors(&["alice"]), SessionAction::Rename, true),
            // An admin's turn counts as a member's.
            (private, authors(&["root"]), SessionAction::Prompt, false),
        ];
        for (facts, turn_authors, action, allowed) in cases {
            assert_eq!(
                turn_allows("t", &turn_authors, facts, action),
                allowed,
                "{turn_authors:?} {:?} {action:?}",
                facts.access
            );
        }
    }

    #[test]
    fn first_prompter_owns() {
        assert_eq!(owner_after_prompt("carol", false, "alice"), "alice");
        assert_eq!(owner_after_prompt("alice", true, "bob"), "alice");
    }

    #[test]
    fn workspace_table() {
        let alice = user("alice", Role::Member);
        let admin = user("root", Role::Admin);
        let cases = [
            (&alice, "notes/a.md", true),
            (&alice, "users/alice/context.md", true),
            (&alice, "users/alice", true),
            (&alice, "users/bob/context.md", false),
            (&alice, "users/alice2/context.md", false),
            (&alice, "users/bob", false),
            (&alice, "usersx/bob.md", true),
            (&admin, "users/bob/context.md", true),
            (&alice, "config/models.json", false),
            (&alice, "config/tenant.json", false),
            (&alice, "config", false),
            (&admin, "config/models.json", true),
            (&alice, "configs/notes.md", true),
            (&alice, "notes/config/models.json", true),
            (&alice, "config/policy.json", false),
            (&admin, "config/policy.json", true),
            (&alice, "users/alice/policy.json", true),
            (&alice, "users/bob/policy.json", false),
            (&admin, "users/bob/policy.json", true),
            (&alice, "config/mcp.json", false),
            (&admin, "config/mcp.json", true),
            (&alice, "users/alice/mcp.json", true),
            (&alice, "users/bob/mcp.json", false),
        ];
        for (who, path, ok) in cases {
            assert_eq!(may_write_workspace(who, path), ok, "{} {path}", who.sub);
        }
    }

    #[test]
    fn tools_write_users_documents_only_for_an_owner_alone() {
        let alice = ["alice".to_string()];
        let both = ["alice".to_string(), "bob".to_string()];
        // A policy is never a tool's to write, not even its owner's own: an agent must not
        // relax the rules it runs under.
        let cases: [(&[String], &str, bool); 13] = [
            (&alice, "users/alice/policy.json", false),
            // Nor a list of MCP servers: where calls (and their credentials) go.
            (&alice, "users/alice/mcp.json", false),
            (&alice, "config/mcp.json", false),
            (&[], "users/alice/policy.json", false),
            (&alice, "config/policy.json", false),
            (&alice, "config/models.json", false),
            (&[], "config/tenant.json", false),
            (&alice, "users/alice/context.md", true),
            (&alice, "users/bob/context.md", false),
            (&both, "users/alice/context.md", false),
            (&both, "notes/a.md", true),
            (&[], "users/alice/context.md", true),
            (&alice, "notes/a.md", true),
        ];
        for (turn_authors, path, ok) in cases {
            let writer = WorkspaceWriter::SessionTool {
                owner: "alice",
                turn_authors,
                rights: &TurnRights::People,
            };
            assert_eq!(writer.may_write(path), ok, "{turn_authors:?} {path}");
        }
    }

    #[test]
    fn runners_and_definitions() {
        let alice = user("alice", Role::Member);
        let admin = user("root", Role::Admin);
        assert!(may_edit_definition(&alice, "alice"));
        assert!(!may_edit_definition(&alice, "bob"));
        assert!(may_edit_definition(&admin, "bob"));
        // (who, the name's owner) → may free it
        let bob = user("bob", Role::Member);
        for (who, owner, want) in [
            (&alice, "alice", true),
            (&alice, "bob", false),
            (&bob, "alice", false),
            (&admin, "alice", true),
            (&admin, "root", true),
        ] {
            assert_eq!(
                may_free_runner_name(who, owner),
                want,
                "{} {owner}",
                who.sub
            );
        }
        assert!(may_name_runner(&alice, "alice", RunnerKind::Local));
        assert!(!may_name_runner(&alice, "bob", RunnerKind::Local));
        assert!(may_name_runner(&alice, "ops", RunnerKind::Cloud));
        assert!(may_name_runner(&admin, "bob", RunnerKind::Local));
        // Local runner of someone other than the turn's author: ask, unless approved already.
        assert!(runner_owner_must_approve(
            RunnerKind::Local,
            "alice",
            "bob",
            false
        ));
        assert!(!runner_owner_must_approve(
            RunnerKind::Local,
            "alice",
            "bob",
            true
        ));
        assert!(!runner_owner_must_approve(
            RunnerKind::Local,
            "alice",
            "alice",
            false
        ));
        assert!(!runner_owner_must_approve(
            RunnerKind::Cloud,
            "ops",
            "bob",
            false
        ));
        assert_eq!(runner_kind_from_claims(None), RunnerKind::Local);
        assert_eq!(
            runner_kind_from_claims(Some(RunnerKind::Cloud)),
            RunnerKind::Cloud
        );
    }

    #[test]
    fn approvals() {
        let alice = user("alice", Role::Member);
        let bob = user("bob", Role::Member);
        let admin = user("root", Role::Admin);
        let mac = Approver::RunnerOwner("alice".into());
        assert!(may_answer_approval(&alice, &mac));
        assert!(!may_answer_approval(&bob, &mac));
        assert!(may_answer_approval(&admin, &mac));
        let session = Approver::SessionOwner("bob".into());
        assert!(may_answer_approval(&bob, &session));
        assert!(!may_answer_approval(&alice, &session));
    }
}
