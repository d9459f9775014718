//! Environment definitions, runner listings and the runner hub's internal API. **API Boundary**:
//! the public `/v1/environments` and `/v1/runners` bodies, and the bodies session actors send to
//! the runner hub (`/resolve`, `/call`).
//!
//! An environment definition is a named, tenant-wide recipe (`local`, `folder-template` or
//! `worktree`) addressed by UUID or by its unique name. [`CreateEnvironmentRequest::into_definition`]
//! and [`EnvironmentDefinition::apply`] validate; [`EnvironmentDefinition::to_spec`] turns a
//! definition into the [`EnvironmentSpec`] a runner materialises.

use serde::{Deserialize, Deserializer, Serialize};

use super::runner::mcp::StdioServer;
use super::runner::{
    EnvironmentKind, EnvironmentSource, EnvironmentSpec, RunnerKind, RunnerMessage, SandboxMode,
    ServerMessage,
};
use crate::cell::{CellSettings, LimitOverrides, Network};

/// Longest environment or runner name.
pub const MAX_NAME_LEN: usize = 64;

/// Longest startup script, in bytes.
pub const MAX_STARTUP_SCRIPT_BYTES: usize = 64 * 1024;

/// Longest path, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;

/// Most extra environment variable names one definition may add.
pub const MAX_EXTRA_ENV_VARS: usize = 64;
/// Highest `costPerHourUsd` a definition may state.
pub const MAX_COST_PER_HOUR_USD: f64 = 10_000.0;

/// Whether attaching an environment needs a person's approval.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ApprovalPolicy {
    /// Attach without asking.
    #[default]
    Auto,
    /// A person approves or denies each attach.
    Ask,
}

impl ApprovalPolicy {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalPolicy::Auto => "auto",
            ApprovalPolicy::Ask => "ask",
        }
    }
}

/// Where a session wants an environment to run (`request_environment`'s `preference`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum RunnerPreference {
    /// Only `local` runners.
    Local,
    /// Only `cloud` runners.
    Cloud,
    /// Either; `local` first.
    #[default]
    Any,
}

impl RunnerPreference {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunnerPreference::Local => "local",
            RunnerPreference::Cloud => "cloud",
            RunnerPreference::Any => "any",
        }
    }

    /// Whether a runner of `kind` satisfies this preference.
    pub fn allows(self, kind: RunnerKind) -> bool {
        match self {
            RunnerPreference::Local => kind == RunnerKind::Local,
            RunnerPreference::Cloud => kind == RunnerKind::Cloud,
            RunnerPreference::Any => true,
        }
    }
}

/// A stored environment definition (`GET /v1/environments/:idOrName`). Every field is always
/// present; fields that do not apply to the kind are `null`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentDefinition {
    /// UUID.
    pub id: String,
    /// Unique within the tenant; `[A-Za-z0-9_.-]{1,64}`, never a UUID.
    pub name: String,
    /// `local`, `folder-template` or `worktree`.
    pub kind: EnvironmentKind,
    /// The runner it lives on; `folder-template` may leave it `null` (any `cloud` runner).
    pub runner: Option<String>,
    /// The user who created it; only they (or an admin) may change or delete it. `null` on
    /// definitions stored before owners existed: only admins may change those.
    #[serde(default)]
    pub owner: Option<String>,
    /// The owner of `runner`, fixed when the definition is created or changed: resolution uses
    /// exactly that user's runner of that name. `null` when `runner` is `null` (and on
    /// definitions stored before this field: then the requesting session owner's runner of that
    /// name, or a cloud runner).
    #[serde(default)]
    pub runner_owner: Option<String>,
    /// The admin who let this definition name another user's local runner; `null` otherwise.
    #[serde(default)]
    pub runner_granted_by: Option<String>,
    /// `local`: absolute directory on the runner.
    pub path: Option<String>,
    /// `folder-template`: absolute template directory on the runner.
    pub template_path: Option<String>,
    /// `folder-template`: script run in the copy with `set -euo pipefail`.
    pub startup_script: Option<String>,
    /// `worktree`: absolute path of the git repository on the runner.
    pub repo_path: Option<String>,
    /// `worktree`: commit-ish to branch from (`HEAD` when `null`).
    pub base_ref: Option<String>,
    /// `auto` or `ask`.
    pub approval: ApprovalPolicy,
    /// Variable names added to the snapshot whitelist.
    pub extra_env_vars: Vec<String>,
    /// The cell's network: `"none"`, `"open"` or `{"allow": ["github.com", "*.npmjs.org"]}`;
    /// `null`: `open` on a person's own machine and for `local` environments, the default
    /// allow list (package registries and git hosts) for copies on cloud runners
    /// (docs/security.md).
    #[serde(default)]
    pub network: Option<Network>,
    /// Directories (toolchains) the cell may read and run besides the system's; never one
    /// holding the runner's own files.
    #[serde(default)]
    pub read_only_paths: Vec<String>,
    /// Resource limits that differ from the defaults (`processes`, `openFiles`,
    /// `fileSizeBytes`, `cpuSeconds`).
    #[serde(default)]
    pub limits: LimitOverrides,
    /// Secrets (names) its commands get as environment variables, each call its own copy in
    /// memory (`docs/security.md`, "Secrets"); a secret must also allow this environment.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// What an hour of it costs in US dollars (a cloud VM's price, say): the estimate a policy's
    /// `costUsdOver` sees when it is attached or starts a job (`docs/security.md`, "Policy").
    /// `null`: unknown, and no cost rule applies. 0 to [`MAX_COST_PER_HOUR_USD`].
    #[serde(default)]
    pub cost_per_hour_usd: Option<serde_json::Number>,
    /// Stdio MCP servers the runner starts in the environment's cell when a session first uses
    /// one; sessions reach each as `<environment>/<name>` through `mcp_tools` / `mcp_call`
    /// ([`super::runner::mcp`], docs/mcp.md).
    #[serde(default)]
    pub mcp_servers: Vec<StdioServer>,
    /// `worktree` only: a child session's worktree made from this definition is kept when the
    /// child ends (default `false`: removed when the child ends, its branch kept;
    /// docs/orchestration.md).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_worktree: bool,
    /// Unix seconds.
    pub created_at: i64,
    /// Unix seconds of the last change.
    pub updated_at: i64,
}

/// `POST /v1/environments`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateEnvironmentRequest {
    /// See [`EnvironmentDefinition::name`].
    pub name: String,
    /// See [`EnvironmentDefinition::kind`].
    pub kind: EnvironmentKind,
    /// See [`EnvironmentDefinition::runner`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<String>,
    /// Whose runner `runner` is, when several users' runners could be meant; default: the
    /// creator's runner of that name, else the one other runner of that name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner_owner: Option<String>,
    /// See [`EnvironmentDefinition::path`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// See [`EnvironmentDefinition::template_path`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_path: Option<String>,
    /// See [`EnvironmentDefinition::startup_script`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_script: Option<String>,
    /// See [`EnvironmentDefinition::repo_path`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_path: Option<String>,
    /// See [`EnvironmentDefinition::base_ref`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ref: Option<String>,
    /// Default `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalPolicy>,
    /// Default empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_env_vars: Option<Vec<String>>,
    /// See [`EnvironmentDefinition::network`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    /// See [`EnvironmentDefinition::read_only_paths`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_paths: Option<Vec<String>>,
    /// See [`EnvironmentDefinition::limits`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitOverrides>,
    /// See [`EnvironmentDefinition::secrets`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<Vec<String>>,
    /// See [`EnvironmentDefinition::cost_per_hour_usd`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hour_usd: Option<serde_json::Number>,
    /// See [`EnvironmentDefinition::mcp_servers`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<Vec<StdioServer>>,
    /// See [`EnvironmentDefinition::keep_worktree`]. Default `false`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_worktree: Option<bool>,
}

/// `PATCH /v1/environments/:idOrName`: absent fields are kept; `null` clears an optional field.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpdateEnvironmentRequest {
    /// New name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// New kind (the fields of the new kind must then be set, those of the old one cleared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<EnvironmentKind>,
    /// New runner, or `null` for none.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub runner: Option<Option<String>>,
    /// Whose runner `runner` is (see [`CreateEnvironmentRequest::runner_owner`]); `null` for
    /// the default.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub runner_owner: Option<Option<String>>,
    /// New path, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub path: Option<Option<String>>,
    /// New template path, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub template_path: Option<Option<String>>,
    /// New startup script, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub startup_script: Option<Option<String>>,
    /// New repository path, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub repo_path: Option<Option<String>>,
    /// New base ref, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub base_ref: Option<Option<String>>,
    /// New approval policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalPolicy>,
    /// New list of extra variable names (replaces the old one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_env_vars: Option<Vec<String>>,
    /// New network, or `null` for the default.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub network: Option<Option<Network>>,
    /// New read-only paths (replaces the old list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_paths: Option<Vec<String>>,
    /// New limits (replaces the old ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitOverrides>,
    /// New secrets (replaces the old list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<Vec<String>>,
    /// New hourly cost, or `null` for unknown.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub cost_per_hour_usd: Option<Option<serde_json::Number>>,
    /// New stdio MCP servers (replaces the old list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<Vec<StdioServer>>,
    /// New `keepWorktree`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_worktree: Option<bool>,
}

/// `Some(None)` for an explicit `null`, `Some(Some(v))` for a value (absent is `None` via
/// `#[serde(default)]`).
fn nullable<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// `GET /v1/environments`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ListEnvironmentsResponse {
    /// Sorted by name.
    pub environments: Vec<EnvironmentDefinition>,
}

impl CreateEnvironmentRequest {
    /// Validates the request and builds the definition.
    ///
    /// # Errors
    ///
    /// A message for a 400 when a field is missing, malformed or does not fit the kind.
    pub fn into_definition(self, id: String, now: i64) -> Result<EnvironmentDefinition, String> {
        let definition = EnvironmentDefinition {
            id,
            name: self.name,
            kind: self.kind,
            runner: self.runner,
            owner: None,
            runner_owner: self.runner_owner,
            runner_granted_by: None,
            path: self.path,
            template_path: self.template_path,
            startup_script: self.startup_script,
            repo_path: self.repo_path,
            base_ref: self.base_ref,
            approval: self.approval.unwrap_or_default(),
            extra_env_vars: self.extra_env_vars.unwrap_or_default(),
            network: self.network,
            read_only_paths: self.read_only_paths.unwrap_or_default(),
            limits: self.limits.unwrap_or_default(),
            secrets: self.secrets.unwrap_or_default(),
            cost_per_hour_usd: self.cost_per_hour_usd,
            mcp_servers: self.mcp_servers.unwrap_or_default(),
            keep_worktree: self.keep_worktree.unwrap_or(false),
            created_at: now,
            updated_at: now,
        };
        definition.validate()?;
        Ok(definition)
    }
}

impl EnvironmentDefinition {
    /// Applies a partial update and validates the result (the definition is unchanged on error).
    ///
    /// # Errors
    ///
    /// A message for a 400, as [`CreateEnvironmentRequest::into_definition`].
    pub fn apply(&self, update: UpdateEnvironmentRequest, now: i64) -> Result<Self, String> {
        let mut next = self.clone();
        if let Some(name) = update.name {
            next.name = name;
        }
        if let Some(kind) = update.kind {
            next.kind = kind;
        }
        let set = |field: &mut Option<String>, value: Option<Option<String>>| {
            if let Some(value) = value {
                *field = value;
            }
        };
        let runner_changed = update.runner.is_some();
        set(&mut next.runner, update.runner);
        match update.runner_owner {
            Some(owner) => next.runner_owner = owner,
            // A new runner name without an owner: the default owner is chosen again.
            None if runner_changed => next.runner_owner = None,
            None => {}
        }
        set(&mut next.path, update.path);
        set(&mut next.template_path, update.template_path);
        set(&mut next.startup_script, update.startup_script);
        set(&mut next.repo_path, update.repo_path);
        set(&mut next.base_ref, update.base_ref);
        if let Some(approval) = update.approval {
            next.approval = approval;
        }
        if let Some(vars) = update.extra_env_vars {
            next.extra_env_vars = vars;
        }
        if let Some(network) = update.network {
            next.network = network;
        }
        if let Some(paths) = update.read_only_paths {
            next.read_only_paths = paths;
        }
        if let Some(limits) = update.limits {
            next.limits = limits;
        }
        if let Some(secrets) = update.secrets {
            next.secrets = secrets;
        }
        if let Some(cost) = update.cost_per_hour_usd {
            next.cost_per_hour_usd = cost;
        }
        if let Some(servers) = update.mcp_servers {
            next.mcp_servers = servers;
        }
        if let Some(keep) = update.keep_worktree {
            next.keep_worktree = keep;
        }
        next.validate()?;
        next.updated_at = now;
        Ok(next)
    }

    /// Checks every rule of a definition.
    ///
    /// # Errors
    ///
    /// The first broken rule, as a message for a 400.
    pub fn validate(&self) -> Result<(), String> {
        check_name("name", &self.name)?;
        if self.keep_worktree && self.kind != EnvironmentKind::Worktree {
            return Err(String::from(
                "keepWorktree applies to worktree definitions only",
            ));
        }
        if let Some(runner) = &self.runner {
            check_name("runner", runner)?;
        }
        if let Some(owner) = &self.runner_owner {
            if self.runner.is_none() {
                return Err(String::from("runnerOwner needs runner"));
            }
            if !crate::authority::valid_name(owner) {
                return Err(String::from(
                    "runnerOwner must be a username (1-128 of A-Z a-z 0-9 _ . @ + -)",
                ));
            }
        }
        let kind = kind_name(self.kind);
        let forbid = |field: &str, value: &Option<String>| -> Result<(), String> {
            match value {
                Some(_) => Err(format!(
                    "a {kind} environment takes no {field} (set it to null or leave it out)"
                )),
                None => Ok(()),
            }
        };
        match self.kind {
            EnvironmentKind::Local => {
                if self.runner.is_none() {
                    return Err(String::from(
                        "a local environment needs runner: the name of the runner it lives on",
                    ));
                }
                check_absolute("path", self.path.as_deref(), kind)?;
                forbid("templatePath", &self.template_path)?;
                forbid("startupScript", &self.startup_script)?;
                forbid("repoPath", &self.repo_path)?;
                forbid("baseRef", &self.base_ref)?;
            }
            EnvironmentKind::FolderTemplate => {
                check_absolute("templatePath", self.template_path.as_deref(), kind)?;
                if let Some(script) = &self.startup_script {
                    if script.trim().is_empty() {
                        return Err(String::from(
                            "startupScript must not be empty (use null for none)",
                        ));
                    }
                    if script.len() > MAX_STARTUP_SCRIPT_BYTES {
                        return Err(format!(
                            "startupScript exceeds {MAX_STARTUP_SCRIPT_BYTES} bytes"
                        ));
                    }
                    if script.contains('\0') {
                        return Err(String::from("startupScript must not contain NUL"));
                    }
                }
                forbid("path", &self.path)?;
                forbid("repoPath", &self.repo_path)?;
                forbid("baseRef", &self.base_ref)?;
            }
            EnvironmentKind::Worktree => {
                if self.runner.is_none() {
                    return Err(String::from(
                        "a worktree environment needs runner: the name of the runner the repository is on",
                    ));
                }
                check_absolute("repoPath", self.repo_path.as_deref(), kind)?;
                if let Some(base_ref) = &self.base_ref {
                    check_base_ref(base_ref)?;
                }
                forbid("path", &self.path)?;
                forbid("templatePath", &self.template_path)?;
                forbid("startupScript", &self.startup_script)?;
            }
        }
        if self.extra_env_vars.len() > MAX_EXTRA_ENV_VARS {
            return Err(format!(
                "extraEnvVars may list at most {MAX_EXTRA_ENV_VARS} names"
            ));
        }
        for var in &self.extra_env_vars {
            check_env_var(var)?;
        }
        if self.secrets.len() > crate::secrets::MAX_TARGETS {
            return Err(format!(
                "secrets may list at most {} names",
                crate::secrets::MAX_TARGETS
            ));
        }
        for (i, name) in self.secrets.iter().enumerate() {
            crate::secrets::check_name(name).map_err(|e| format!("secrets: {e}"))?;
            if self.secrets[..i].contains(name) {
                return Err(format!("secrets lists {name} twice"));
            }
            if self.extra_env_vars.contains(name) {
                // A snapshot's variables are shown to every reader of the session.
                return Err(format!(
                    "{name} is in both secrets and extraEnvVars; a secret is never captured into a snapshot"
                ));
            }
        }
        if let Some(cost) = &self.cost_per_hour_usd {
            let fine = cost
                .as_f64()
                .is_some_and(|c| c.is_finite() && (0.0..=MAX_COST_PER_HOUR_USD).contains(&c));
            if !fine {
                return Err(format!(
                    "costPerHourUsd must be a number of dollars from 0 to {MAX_COST_PER_HOUR_USD}"
                ));
            }
        }
        super::runner::mcp::check_servers(&self.mcp_servers)?;
        self.cell().validate()
    }

    /// The definition's cell settings.
    pub fn cell(&self) -> CellSettings {
        CellSettings {
            network: self.network.clone(),
            read_only_paths: self.read_only_paths.clone(),
            limits: self.limits,
        }
    }

    /// The spec a runner materialises, named `name` within the session.
    pub fn to_spec(&self, name: &str) -> EnvironmentSpec {
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        let source = match self.kind {
            EnvironmentKind::Local => EnvironmentSource::Local {
                path: text(&self.path),
            },
            EnvironmentKind::FolderTemplate => EnvironmentSource::FolderTemplate {
                template_path: text(&self.template_path),
                startup_script: self.startup_script.clone(),
            },
            EnvironmentKind::Worktree => EnvironmentSource::Worktree {
                repo_path: text(&self.repo_path),
                base_ref: self.base_ref.clone(),
            },
        };
        EnvironmentSpec {
            name: name.to_string(),
            source,
            extra_env_vars: self.extra_env_vars.clone(),
            cell: self.cell(),
        }
    }
}

/// The wire name of an environment kind.
pub fn kind_name(kind: EnvironmentKind) -> &'static str {
    match kind {
        EnvironmentKind::Local => "local",
        EnvironmentKind::FolderTemplate => "folder-template",
        EnvironmentKind::Worktree => "worktree",
    }
}

/// Whether `text` has the shape of a UUID (`8-4-4-4-12` hex digits).
pub fn looks_like_uuid(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Checks an environment or runner name: `[A-Za-z0-9_.-]{1,64}`, not `.`/`..`, not a UUID.
///
/// # Errors
///
/// A message naming `field`.
pub fn check_name(field: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!("{field} must be 1 to {MAX_NAME_LEN} characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        return Err(format!(
            "{field} {name:?} may contain only letters, digits, '-', '_' and '.'"
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("{field} must not be {name:?}"));
    }
    if looks_like_uuid(name) {
        return Err(format!(
            "{field} must not be a UUID (UUIDs address definitions by id)"
        ));
    }
    Ok(())
}

fn check_absolute(field: &str, value: Option<&str>, kind: &str) -> Result<(), String> {
    let Some(path) = value else {
        return Err(format!(
            "a {kind} environment needs {field}: an absolute path on the runner"
        ));
    };
    if !path.starts_with('/') {
        return Err(format!(
            "{field} must be an absolute path (starting with /), got {path:?}"
        ));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!("{field} exceeds {MAX_PATH_BYTES} bytes"));
    }
    if path.chars().any(char::is_control) {
        return Err(format!("{field} must not contain control characters"));
    }
    Ok(())
}

fn check_base_ref(base_ref: &str) -> Result<(), String> {
    if base_ref.is_empty() || base_ref.len() > 256 {
        return Err(String::from(
            "baseRef must be 1 to 256 characters (use null for HEAD)",
        ));
    }
    if base_ref.starts_with('-') {
        return Err(String::from("baseRef must not start with '-'"));
    }
    if base_ref
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(String::from(
            "baseRef must not contain whitespace or control characters",
        ));
    }
    Ok(())
}

fn check_env_var(var: &str) -> Result<(), String> {
    let mut bytes = var.bytes();
    let valid = var.len() <= 128
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "extraEnvVars entry {var:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
        ))
    }
}

/// An environment a runner offers, in a runner listing.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunnerEnvironmentInfo {
    /// Name (`--env NAME=PATH`).
    pub name: String,
    /// Absolute path on the runner.
    pub path: String,
}

/// One runner in `GET /v1/runners`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct RunnerInfo {
    /// Name, unique per owner.
    pub name: String,
    /// The user (`sub`) whose runner token registered it.
    pub owner: String,
    /// `local` or `cloud`.
    pub kind: RunnerKind,
    /// Display name of the OS.
    pub os: String,
    /// CPU architecture.
    pub arch: String,
    /// Whether a connection is open now.
    pub connected: bool,
    /// Unix seconds of the last frame or heartbeat seen.
    pub last_seen: i64,
    /// Unix seconds the open connection was made; `null` when not connected.
    pub connected_at: Option<i64>,
    /// Software version the runner reported.
    pub version: Option<String>,
    /// `on` when it confines sessions in cells, `off` when it was started with
    /// `--sandbox off` (sessions then act with the runner's own rights); `null` for runners
    /// older than cells.
    #[serde(default)]
    pub sandbox: Option<SandboxMode>,
    /// Tools and environment kinds it supports.
    pub capabilities: Vec<String>,
    /// Environments it offers.
    pub environments: Vec<RunnerEnvironmentInfo>,
}

/// `GET /v1/runners`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ListRunnersResponse {
    /// Sorted by owner, then name.
    pub runners: Vec<RunnerInfo>,
}

/// Runner hub `POST /resolve`: which environment, on which runner, a session's
/// `request_environment` gets.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResolveEnvironmentRequest {
    /// A definition id or name, an environment a runner offers, or `runner:environment`.
    pub spec: String,
    /// Default `any`.
    #[serde(default)]
    pub preference: RunnerPreference,
    /// The environment's name in the session; default: the definition's or offered name.
    #[serde(default)]
    pub name: Option<String>,
    /// The asking session, for diagnostics.
    #[serde(default)]
    pub session_id: String,
}

/// Answer to [`ResolveEnvironmentRequest`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ResolveEnvironmentResponse {
    /// What to send in `attach`.
    pub spec: EnvironmentSpec,
    /// The chosen runner's name.
    pub runner: String,
    /// The chosen runner's owner (`sub`); with `runner` it addresses `/call`.
    pub runner_owner: String,
    /// The chosen runner's kind.
    pub runner_kind: RunnerKind,
    /// The chosen runner's OS display name.
    pub runner_os: String,
    /// The definition's policy; `auto` for an environment a runner offers.
    pub approval: ApprovalPolicy,
    /// The definition used, if any.
    pub definition_id: Option<String>,
    /// The definition's name, if any (what a secret's `environments` name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition_name: Option<String>,
    /// The definition's `secrets`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// The definition's `costPerHourUsd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hour_usd: Option<serde_json::Number>,
    /// The definition's `mcpServers`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<StdioServer>,
    /// The definition's `keepWorktree`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_worktree: bool,
}

/// Runner hub `POST /call`: send a request frame to a runner and wait for its answer.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerCallRequest {
    /// Runner name.
    pub runner: String,
    /// Runner owner (`sub`).
    pub owner: String,
    /// `attach`, `detach`, `validate`, `tool_call` or `cancel`.
    pub message: ServerMessage,
    /// How long to wait for the answer (default 120 000, at most 3 600 000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Answer to [`RunnerCallRequest`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunnerCallResponse {
    /// The connection the request went over (increases with every connection of the hub).
    pub epoch: u64,
    /// The runner's answer with the same `id` (a result, or an `error` frame); `null` for
    /// `cancel`.
    pub response: Option<RunnerMessage>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn create(value: serde_json::Value) -> Result<EnvironmentDefinition, String> {
        let request: CreateEnvironmentRequest =
            serde_json::from_value(value).map_err(|e| e.to_string())?;
        request.into_definition(String::from("00000000-0000-4000-8000-000000000000"), 7)
    }

    #[test]
    fn valid_definitions() {
        let local =
            create(json!({"name": "api", "kind": "local", "runner": "mac", "path": "/src/api"}))
                .unwrap();
        assert_eq!(local.approval, ApprovalPolicy::Auto);
        let value = serde_json::to_value(&local).unwrap();
        assert_eq!(value["templatePath"], serde_json::Value::Null);
        assert_eq!(value["kind"], "local");
        let template = create(json!({"name": "web", "kind": "folder-template", "templatePath": "/t", "startupScript": "npm ci", "approval": "ask"})).unwrap();
        assert_eq!(template.runner, None);
        assert_eq!(
            serde_json::to_value(template.to_spec("w")).unwrap(),
            json!({"name": "w", "kind": "folder-template", "templatePath": "/t", "startupScript": "npm ci"})
        );
        create(json!({"name": "repo", "kind": "worktree", "runner": "vm", "repoPath": "/r", "baseRef": "main", "extraEnvVars": ["JAVA_HOME"]})).unwrap();
        let with_secrets = create(json!({"name": "ci", "kind": "local", "runner": "mac", "path": "/src", "secrets": ["GITHUB_TOKEN", "NPM_TOKEN"]})).unwrap();
        assert_eq!(with_secrets.secrets, ["GITHUB_TOKEN", "NPM_TOKEN"]);
        let update: UpdateEnvironmentRequest =
            serde_json::from_value(json!({"secrets": []})).unwrap();
        assert!(with_secrets.apply(update, 8).unwrap().secrets.is_empty());
        // An hourly cost at its bounds; `null` in a PATCH makes it unknown again.
        for cost in [json!(0), json!(0.25), json!(MAX_COST_PER_HOUR_USD)] {
            let priced = create(json!({"name": "vm", "kind": "local", "runner": "mac", "path": "/src", "costPerHourUsd": cost})).unwrap();
            assert_eq!(
                serde_json::to_value(&priced).unwrap()["costPerHourUsd"],
                cost
            );
        }
        let priced = create(json!({"name": "vm", "kind": "local", "runner": "mac", "path": "/src", "costPerHourUsd": 2})).unwrap();
        let update: UpdateEnvironmentRequest =
            serde_json::from_value(json!({"costPerHourUsd": null})).unwrap();
        assert_eq!(priced.apply(update, 8).unwrap().cost_per_hour_usd, None);
    }

    #[test]
    fn invalid_definitions() {
        let cases = [
            (
                json!({"name": "", "kind": "local", "runner": "m", "path": "/x"}),
                "1 to 64",
            ),
            (
                json!({"name": "a b", "kind": "local", "runner": "m", "path": "/x"}),
                "only letters",
            ),
            (
                json!({"name": "0f3c2a1b-0000-4000-8000-000000000000", "kind": "local", "runner": "m", "path": "/x"}),
                "UUID",
            ),
            (
                json!({"name": "a", "kind": "local", "path": "/x"}),
                "needs runner",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "x"}),
                "absolute",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m"}),
                "needs path",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "templatePath": "/t"}),
                "takes no templatePath",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "keepWorktree": true}),
                "keepWorktree applies to worktree definitions only",
            ),
            (
                json!({"name": "a", "kind": "folder-template"}),
                "needs templatePath",
            ),
            (
                json!({"name": "a", "kind": "worktree", "repoPath": "/r"}),
                "needs runner",
            ),
            (
                json!({"name": "a", "kind": "worktree", "runner": "m", "repoPath": "/r", "baseRef": "--upload-pack=x"}),
                "start with '-'",
            ),
            (
                json!({"name": "a", "kind": "worktree", "runner": "m", "repoPath": "/r", "extraEnvVars": ["1X"]}),
                "not a variable name",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "color": "red"}),
                "unknown field",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "secrets": ["gh"]}),
                "secrets: a secret's name is an environment variable name",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "secrets": ["GH", "GH"]}),
                "secrets lists GH twice",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "secrets": ["GH"], "extraEnvVars": ["GH"]}),
                "GH is in both secrets and extraEnvVars",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "secrets": (0..33).map(|i| format!("S{i}")).collect::<Vec<_>>()}),
                "secrets may list at most 32 names",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "mcpServers": [{"name": "Bad", "command": "x"}]}),
                "mcpServers[0].name \"Bad\" must be 1 to 32",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "costPerHourUsd": -0.01}),
                "costPerHourUsd must be a number of dollars from 0 to 10000",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "costPerHourUsd": 10000.5}),
                "costPerHourUsd must be",
            ),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "costPerHourUsd": "1"}),
                "invalid type",
            ),
            (json!({"name": "a", "kind": "moon"}), "unknown variant"),
            (
                json!({"name": "a", "kind": "local", "runner": "m", "path": "/x", "approval": "maybe"}),
                "unknown variant",
            ),
        ];
        for (value, needle) in cases {
            let err = create(value.clone()).unwrap_err();
            assert!(err.contains(needle), "{value}: {err}");
        }
    }

    #[test]
    fn patch_keeps_absent_and_clears_null() {
        let template = create(json!({"name": "web", "kind": "folder-template", "templatePath": "/t", "startupScript": "x", "runner": "vm"})).unwrap();
        let update: UpdateEnvironmentRequest =
            serde_json::from_value(json!({"runner": null, "approval": "ask"})).unwrap();
        let next = template.apply(update, 9).unwrap();
        assert_eq!(next.runner, None);
        assert_eq!(next.startup_script.as_deref(), Some("x"));
        assert_eq!(next.approval, ApprovalPolicy::Ask);
        assert_eq!((next.created_at, next.updated_at), (7, 9));
        let to_local: UpdateEnvironmentRequest =
            serde_json::from_value(json!({"kind": "local", "path": "/p"})).unwrap();
        assert!(
            next.apply(to_local, 9)
                .unwrap_err()
                .contains("needs runner")
        );
        let ok: UpdateEnvironmentRequest = serde_json::from_value(json!({"kind": "local", "path": "/p", "runner": "vm", "templatePath": null, "startupScript": null})).unwrap();
        assert_eq!(next.apply(ok, 9).unwrap().kind, EnvironmentKind::Local);
        assert!(serde_json::from_value::<UpdateEnvironmentRequest>(json!({"nope": 1})).is_err());
    }

    #[test]
    fn uuid_shape() {
        assert!(looks_like_uuid("0f3c2a1b-0000-4000-8000-00000000abcd"));
        assert!(!looks_like_uuid("api"));
        assert!(!looks_like_uuid("0f3c2a1b00000-4000-8000-00000000abcd"));
    }
}
