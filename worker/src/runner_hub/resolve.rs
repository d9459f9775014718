//! Resolving a session's `request_environment(spec, preference, name?)` to an environment spec
//! and a runner. Pure: works on a snapshot of definitions and runners.
//!
//! Order: (a) a definition whose id or name is `spec`; (b) an environment a runner offers
//! (`--env NAME=PATH`), as `NAME` or `RUNNER:NAME`. Only runners owned by the caller or of kind
//! `cloud` are eligible, and only connected ones are chosen.
//!
//! Runner choice:
//! * A definition naming a runner uses that runner (the caller's own one of that name first,
//!   else a `cloud` runner of that name); it must be connected and match the preference (unless
//!   the preference is `any`).
//! * A `folder-template` without a runner: `cloud` → a cloud runner; `local` → one of the
//!   caller's local runners; `any` → a cloud runner first (the definition's default home), else
//!   one of the caller's local runners. Runners that list `environment:*` capabilities without
//!   `environment:folder-template` are skipped.
//! * An offered environment: `local`/`cloud` filter by kind; `any` prefers the caller's local
//!   runners, then cloud runners.
//!
//! Ties go to the caller's own runner, then by name.

use wuhu_core::wire::runner::{
    EnvironmentKind, EnvironmentSource, EnvironmentSpec, OfferedEnvironment, RunnerKind,
    capabilities,
};
use wuhu_core::wire::{
    ApprovalPolicy, EnvironmentDefinition, ResolveEnvironmentRequest, ResolveEnvironmentResponse,
    RunnerPreference, check_name, kind_name,
};

use crate::http::{ApiError, ApiResult};

/// A runner as resolution sees it.
#[derive(Clone, Debug)]
pub(super) struct RunnerView {
    pub(super) owner: String,
    pub(super) name: String,
    pub(super) kind: RunnerKind,
    pub(super) os: String,
    pub(super) environments: Vec<OfferedEnvironment>,
    pub(super) capabilities: Vec<String>,
    pub(super) connected: bool,
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

fn unavailable(message: String) -> ApiError {
    ApiError::new(409, "runner_unavailable", message)
}

/// Resolves `request` for the user `sub`.
pub(super) fn resolve(
    sub: &str,
    request: &ResolveEnvironmentRequest,
    definitions: &[EnvironmentDefinition],
    runners: &[RunnerView],
) -> ApiResult<ResolveEnvironmentResponse> {
    let spec = request.spec.trim();
    if spec.is_empty() {
        return Err(ApiError::bad_request("spec must not be empty"));
    }
    if let Some(name) = &request.name {
        check_name("name", name).map_err(ApiError::bad_request)?;
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
        return Ok(answer(
            definition.to_spec(name),
            runner,
            definition.approval,
            Some(definition.id.clone()),
        ));
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
        return Err(ApiError::not_found(format!(
            "no environment or runner matches {spec:?}; {listing}"
        )));
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
    // `any` prefers the caller's local runners, then cloud ones; ties: own first, then name.
    usable.sort_by_key(|r| (r.kind != RunnerKind::Local, r.owner != sub, r.name.clone()));
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
    };
    Ok(answer(spec, runner, ApprovalPolicy::Auto, None))
}

fn runner_for_definition<'a>(
    sub: &str,
    definition: &EnvironmentDefinition,
    preference: RunnerPreference,
    eligible: &[&'a RunnerView],
    listing: &str,
) -> ApiResult<&'a RunnerView> {
    let env = &definition.name;
    let kind = definition.kind;
    if let Some(wanted) = &definition.runner {
        let mut named: Vec<&RunnerView> = eligible
            .iter()
            .copied()
            .filter(|r| &r.name == wanted)
            .collect();
        if named.is_empty() {
            return Err(unavailable(format!(
                "environment {env:?} uses runner {wanted:?}, which has never connected (or is another user's local runner); {listing}"
            )));
        }
        named.sort_by_key(|r| (!r.connected, r.owner != sub));
        let runner = named[0];
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
    // Only folder-template definitions may leave the runner out.
    let mut candidates: Vec<&RunnerView> = eligible
        .iter()
        .copied()
        .filter(|r| r.connected && r.supports(kind))
        .filter(|r| match preference {
            RunnerPreference::Cloud => r.kind == RunnerKind::Cloud,
            RunnerPreference::Local => r.kind == RunnerKind::Local,
            RunnerPreference::Any => true,
        })
        .collect();
    candidates.sort_by_key(|r| (r.kind != RunnerKind::Cloud, r.owner != sub, r.name.clone()));
    candidates.first().copied().ok_or_else(|| {
        let wanted = match preference {
            RunnerPreference::Cloud => "a connected cloud runner",
            RunnerPreference::Local => "one of your connected local runners",
            RunnerPreference::Any => "a connected cloud runner (or one of your local runners)",
        };
        unavailable(format!(
            "environment {env:?} ({}) needs {wanted}, and none is available; {listing}",
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
