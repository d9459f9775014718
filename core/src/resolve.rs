//! Which runner an environment definition may name, and resolving a session's
//! `request_environment(spec, preference, name?)` to an environment spec and a runner. Pure:
//! works on a snapshot of definitions and runners the runner hub reads.
//!
//! Binding ([`bind_runner`], at create and patch): a definition that names a runner records
//! whose runner it is (`runnerOwner`). Its owner may name their own runners and cloud runners;
//! an admin may name any runner (recorded in `runnerGrantedBy`). Anyone else: 403.
//!
//! Resolution order: (a) a definition whose id or name is `spec`; (b) an environment a runner
//! offers (`--env NAME=PATH`), as `NAME` or `RUNNER:NAME`. Only runners owned by the session's
//! owner or of kind `cloud` (by token) are eligible, and only connected ones are chosen.
//!
//! Runner choice:
//! * A definition naming a runner uses exactly `(runnerOwner, runner)`: never another user's
//!   runner of the same name. The binding rule is checked again (the runner's kind may have
//!   changed since). It must be connected and match the preference (unless `any`).
//! * A `folder-template` without a runner runs only on `cloud` runners (a person's machine is
//!   never picked for a definition that did not name it).
//! * An offered environment: `local`/`cloud` filter by kind; `any` prefers the session owner's
//!   local runners, then cloud runners.
//!
//! Ties go to the session owner's own runner, then by name.

use crate::authority::Principal;
use crate::wire::runner::{
    EnvironmentKind, EnvironmentSource, EnvironmentSpec, OfferedEnvironment, RunnerKind,
    capabilities,
};
use crate::wire::{
    ApprovalPolicy, EnvironmentDefinition, ResolveEnvironmentRequest, ResolveEnvironmentResponse,
    RunnerPreference, check_name, kind_name,
};

/// A runner as resolution sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerView {
    /// Its owner (`sub` of its token).
    pub owner: String,
    /// Its name.
    pub name: String,
    /// Its kind, from its token.
    pub kind: RunnerKind,
    /// OS display name.
    pub os: String,
    /// Environments it offers.
    pub environments: Vec<OfferedEnvironment>,
    /// Capabilities it listed.
    pub capabilities: Vec<String>,
    /// Whether it is connected now.
    pub connected: bool,
}

impl RunnerView {
    fn supports(&self, kind: EnvironmentKind) -> bool {
        let declares_kinds = self
            .capabilities
            .iter()
            .any(|c| c.starts_with("environment:"));
        let wanted = match kind {
            EnvironmentKind::Local => capabilities::ENV_LOCAL,
            EnvironmentKind::FolderTemplate => capabilities::ENV_FOLDER_TEMPLATE,
            EnvironmentKind::Worktree => capabilities::ENV_WORKTREE,
        };
        !declares_kinds || self.capabilities.iter().any(|c| c == wanted)
    }

    fn describe(&self) -> String {
        format!("{} ({}, {})", self.name, self.kind.as_str(), self.os)
    }
}

/// What kind of failure a [`ResolveError`] is; decides the HTTP status and error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResolveErrorKind {
    /// 400 `bad_request`.
    BadRequest,
    /// 403 `forbidden`.
    Forbidden,
    /// 404 `not_found`.
    NotFound,
    /// 409 `runner_unavailable`.
    Unavailable,
}

/// Why a spec did not resolve, or a definition may not name a runner.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ResolveError {
    /// The kind of failure.
    pub kind: ResolveErrorKind,
    /// Human-readable; lists what is available where that helps.
    pub message: String,
}

impl ResolveError {
    fn new(kind: ResolveErrorKind, message: impl Into<String>) -> ResolveError {
        ResolveError {
            kind,
            message: message.into(),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self.kind {
            ResolveErrorKind::BadRequest => 400,
            ResolveErrorKind::Forbidden => 403,
            ResolveErrorKind::NotFound => 404,
            ResolveErrorKind::Unavailable => 409,
        }
    }

    /// The JSON error code.
    pub fn code(&self) -> &'static str {
        match self.kind {
            ResolveErrorKind::BadRequest => "bad_request",
            ResolveErrorKind::Forbidden => "forbidden",
            ResolveErrorKind::NotFound => "not_found",
            ResolveErrorKind::Unavailable => "runner_unavailable",
        }
    }
}

fn unavailable(message: String) -> ResolveError {
    ResolveError::new(ResolveErrorKind::Unavailable, message)
}

/// Whether a definition owned by `owner` may use `runner`, as bound (see [`bind_runner`]).
fn definition_may_use(definition: &EnvironmentDefinition, runner: &RunnerView) -> bool {
    definition.owner.as_deref() == Some(runner.owner.as_str())
        || runner.kind == RunnerKind::Cloud
        || definition.runner_granted_by.is_some()
}

/// Fixes whose runner `definition.runner` is, as `who` creates or changes it, and checks that
/// `who` may name it: the definition's owner's own runners and cloud runners for everyone,
/// any runner for admins (recorded in `runnerGrantedBy`). `definition.owner` must be set.
///
/// # Errors
/// 403 when the runner is another user's local runner (or another user's runner that never
/// connected) and `who` is not an admin.
pub fn bind_runner(
    who: &Principal,
    definition: &mut EnvironmentDefinition,
    runners: &[RunnerView],
) -> Result<(), ResolveError> {
    definition.runner_granted_by = None;
    let Some(name) = definition.runner.clone() else {
        definition.runner_owner = None;
        return Ok(());
    };
    let def_owner = definition.owner.clone().unwrap_or_default();
    let named = |owner: &str| runners.iter().find(|r| r.name == name && r.owner == owner);
    let runner_owner = match definition.runner_owner.clone() {
        Some(owner) => owner,
        None => {
            let mut others = runners
                .iter()
                .filter(|r| r.name == name && r.owner != def_owner);
            match (named(&def_owner), others.next(), others.next()) {
                (Some(_), _, _) | (None, None, _) => def_owner.clone(),
                (None, Some(other), None) => other.owner.clone(),
                (None, Some(_), Some(_)) => {
                    return Err(ResolveError::new(
                        ResolveErrorKind::BadRequest,
                        format!(
                            "several users have a runner named {name:?}; set runnerOwner to say whose"
                        ),
                    ));
                }
            }
        }
    };
    let allowed = match named(&runner_owner) {
        Some(runner) => {
            runner.owner == def_owner || runner.kind == RunnerKind::Cloud || who.is_admin()
        }
        // Never connected: only the definition's owner's own runner, unless an admin says so.
        None => runner_owner == def_owner || who.is_admin(),
    };
    if !allowed {
        return Err(ResolveError::new(
            ResolveErrorKind::Forbidden,
            format!(
                "runner {name:?} is {runner_owner:?}'s local runner; a definition may name only its owner's runners and cloud runners (an admin may name any)"
            ),
        ));
    }
    let crosses = runner_owner != def_owner
        && named(&runner_owner).is_none_or(|r| r.kind != RunnerKind::Cloud);
    if crosses {
        definition.runner_granted_by = Some(who.sub.clone());
    }
    definition.runner_owner = Some(runner_owner);
    Ok(())
}

/// Resolves `request` for a session owned by `sub`.
///
/// # Errors
/// A [`ResolveError`] naming what is available.
pub fn resolve(
    sub: &str,
    request: &ResolveEnvironmentRequest,
    definitions: &[EnvironmentDefinition],
    runners: &[RunnerView],
) -> Result<ResolveEnvironmentResponse, ResolveError> {
    let spec = request.spec.trim();
    if spec.is_empty() {
        return Err(ResolveError::new(
            ResolveErrorKind::BadRequest,
            "spec must not be empty",
        ));
    }
    if let Some(name) = &request.name {
        check_name("name", name).map_err(|m| ResolveError::new(ResolveErrorKind::BadRequest, m))?;
    }
    let preference = request.preference;
    let eligible: Vec<&RunnerView> = runners
        .iter()
        .filter(|r| r.owner == sub || r.kind == RunnerKind::Cloud)
        .collect();
    let listing = listing(definitions, &eligible);

    if let Some(definition) = definitions.iter().find(|d| d.id == spec || d.name == spec) {
        let runner = runner_for_definition(sub, definition, preference, &eligible, &listing)?;
        let name = request.name.as_deref().unwrap_or(&definition.name);
        let mut answer = answer(
            definition.to_spec(name),
            runner,
            definition.approval,
            Some(definition.id.clone()),
        );
        answer.definition_name = Some(definition.name.clone());
        answer.secrets = definition.secrets.clone();
        answer.cost_per_hour_usd = definition.cost_per_hour_usd.clone();
        answer.mcp_servers = definition.mcp_servers.clone();
        answer.keep_worktree = definition.keep_worktree;
        return Ok(answer);
    }

    let (runner_name, env_name) = match spec.split_once(':') {
        Some((runner, env)) => (Some(runner), env),
        None => (None, spec),
    };
    let offering: Vec<&RunnerView> = eligible
        .iter()
        .copied()
        .filter(|r| runner_name.is_none_or(|n| r.name == n))
        .filter(|r| r.environments.iter().any(|e| e.name == env_name))
        .collect();
    if offering.is_empty() {
        return Err(ResolveError::new(
            ResolveErrorKind::NotFound,
            format!("no environment or runner matches {spec:?}; {listing}"),
        ));
    }
    let connected: Vec<&RunnerView> = offering.iter().copied().filter(|r| r.connected).collect();
    if connected.is_empty() {
        let names = offering
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(unavailable(format!(
            "environment {env_name:?} is offered by {names}, which is not connected; {listing}"
        )));
    }
    let mut usable: Vec<&RunnerView> = connected
        .iter()
        .copied()
        .filter(|r| preference.allows(r.kind))
        .collect();
    if usable.is_empty() {
        let names = connected
            .iter()
            .map(|r| r.describe())
            .collect::<Vec<_>>()
            .join(", ");
        return Err(unavailable(format!(
            "environment {env_name:?} is offered only by {names}, which does not match preference {}; {listing}",
            preference.as_str()
        )));
    }
    // `any` prefers the session owner's local runners, then cloud ones; ties: own first, then
    // name, then owner (deterministic whatever the storage order).
    usable.sort_by_key(|r| {
        (
            r.kind != RunnerKind::Local,
            r.owner != sub,
            r.name.clone(),
            r.owner.clone(),
        )
    });
    let runner = usable[0];
    let path = runner
        .environments
        .iter()
        .find(|e| e.name == env_name)
        .map(|e| e.path.clone())
        .unwrap_or_default();
    let spec = EnvironmentSpec {
        name: request.name.clone().unwrap_or_else(|| env_name.to_string()),
        source: EnvironmentSource::Local { path },
        extra_env_vars: Vec::new(),
        cell: Default::default(),
    };
    Ok(answer(spec, runner, ApprovalPolicy::Auto, None))
}

fn runner_for_definition<'a>(
    sub: &str,
    definition: &EnvironmentDefinition,
    preference: RunnerPreference,
    eligible: &[&'a RunnerView],
    listing: &str,
) -> Result<&'a RunnerView, ResolveError> {
    let env = &definition.name;
    let kind = definition.kind;
    if let Some(wanted) = &definition.runner {
        let runner = match &definition.runner_owner {
            Some(owner) => eligible
                .iter()
                .copied()
                .find(|r| &r.name == wanted && &r.owner == owner),
            // Stored before runner owners existed: the session owner's runner of that name,
            // else a cloud runner of that name.
            None => {
                let mut named: Vec<&RunnerView> = eligible
                    .iter()
                    .copied()
                    .filter(|r| &r.name == wanted)
                    .collect();
                named.sort_by_key(|r| (r.owner != sub, !r.connected, r.owner.clone()));
                named.first().copied()
            }
        };
        let Some(runner) = runner else {
            let whose = definition
                .runner_owner
                .as_deref()
                .map_or(String::new(), |o| format!(" of {o:?}"));
            return Err(unavailable(format!(
                "environment {env:?} uses runner {wanted:?}{whose}, which has never connected (or is another user's local runner); {listing}"
            )));
        };
        let legacy_ok = definition.owner.is_none() && definition.runner_owner.is_none();
        if !legacy_ok && !definition_may_use(definition, runner) {
            return Err(ResolveError::new(
                ResolveErrorKind::Forbidden,
                format!(
                    "environment {env:?} names runner {wanted:?} of {:?}, a local runner its owner may not use; an admin or the definition's owner must change it",
                    runner.owner
                ),
            ));
        }
        if !runner.connected {
            return Err(unavailable(format!(
                "environment {env:?} uses runner {wanted:?}, which is not connected; {listing}"
            )));
        }
        if !preference.allows(runner.kind) {
            return Err(unavailable(format!(
                "environment {env:?} uses runner {} which does not match preference {}; {listing}",
                runner.describe(),
                preference.as_str()
            )));
        }
        if !runner.supports(kind) {
            return Err(unavailable(format!(
                "environment {env:?} is a {} environment but runner {wanted:?} does not support that kind; {listing}",
                kind_name(kind)
            )));
        }
        return Ok(runner);
    }
    // Only folder-template definitions may leave the runner out, and they run only on cloud
    // runners: a person's machine is never picked for a definition that did not name it.
    if preference == RunnerPreference::Local {
        return Err(unavailable(format!(
            "environment {env:?} ({}) names no runner, so it runs only on cloud runners; it does not match preference local; {listing}",
            kind_name(kind)
        )));
    }
    let mut candidates: Vec<&RunnerView> = eligible
        .iter()
        .copied()
        .filter(|r| r.connected && r.supports(kind) && r.kind == RunnerKind::Cloud)
        .collect();
    candidates.sort_by_key(|r| (r.owner != sub, r.name.clone(), r.owner.clone()));
    candidates.first().copied().ok_or_else(|| {
        unavailable(format!(
            "environment {env:?} ({}) needs a connected cloud runner, and none is available; {listing}",
            kind_name(kind)
        ))
    })
}

fn answer(
    spec: EnvironmentSpec,
    runner: &RunnerView,
    approval: ApprovalPolicy,
    definition_id: Option<String>,
) -> ResolveEnvironmentResponse {
    ResolveEnvironmentResponse {
        spec,
        runner: runner.name.clone(),
        runner_owner: runner.owner.clone(),
        runner_kind: runner.kind,
        runner_os: runner.os.clone(),
        approval,
        definition_id,
        definition_name: None,
        secrets: Vec::new(),
        cost_per_hour_usd: None,
        mcp_servers: Vec::new(),
        keep_worktree: false,
    }
}

/// `definitions: a, b; runner environments: mac:api; connected runners: mac (local, macOS)`.
fn listing(definitions: &[EnvironmentDefinition], eligible: &[&RunnerView]) -> String {
    let or_none = |items: Vec<String>| {
        if items.is_empty() {
            String::from("none")
        } else {
            items.join(", ")
        }
    };
    let connected: Vec<&&RunnerView> = eligible.iter().filter(|r| r.connected).collect();
    let defs = or_none(definitions.iter().map(|d| d.name.clone()).collect());
    let envs = or_none(
        connected
            .iter()
            .flat_map(|r| {
                r.environments
                    .iter()
                    .map(move |e| format!("{}:{}", r.name, e.name))
            })
            .collect(),
    );
    let runners = or_none(connected.iter().map(|r| r.describe()).collect());
    format!("definitions: {defs}; runner environments: {envs}; connected runners: {runners}")
}

#[cfg(test)]
mod tests;
