//! Environments attached to a session: which one a tool call targets, and what the transcript
//! says about them. The runner protocol types are in [`crate::wire::runner`].

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wire::runner::{AttachedEnvironment, RunnerKind, StaleItem};

/// An environment attached to a session, as the session stores it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[cfg_attr(test, derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    /// What the runner materialised (name, kind, root, snapshot, ...).
    pub environment: AttachedEnvironment,
    /// The runner's name.
    pub runner: String,
    /// The runner's owner (`sub`).
    pub runner_owner: String,
    /// `local` or `cloud`.
    pub runner_kind: RunnerKind,
    /// The definition it came from, if any.
    pub definition_id: Option<String>,
    /// That definition's name (what a secret's `environments` name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definition_name: Option<String>,
    /// The secrets (names) its commands get (the definition's `secrets`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// The definition's `costPerHourUsd` (a job's cost estimate, `crate::policy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hour_usd: Option<serde_json::Number>,
    /// The definition's stdio MCP servers (`mcp_tools` lists them as `<environment>/<name>`;
    /// the runner starts each when first used).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<crate::wire::runner::mcp::StdioServer>,
    /// Unix seconds.
    pub attached_at: i64,
}

impl Attachment {
    /// The environment's name in the session.
    pub fn name(&self) -> &str {
        &self.environment.name
    }
}

/// Picks the attachment a call targets. `requested` is the call's `environment` argument.
///
/// # Errors
/// A message for the model: nothing attached, unknown name, or several attached and none named.
pub fn pick<'a>(
    attached: &'a [Attachment],
    requested: Option<&str>,
) -> Result<&'a Attachment, String> {
    let names = || {
        attached
            .iter()
            .map(|a| format!("{:?}", a.name()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (requested, attached) {
        (_, []) => Err(
            "No environment is attached to this session. Call request_environment first (the workspace knowledge base needs none: use wuhu://workspace/<path>).".into(),
        ),
        (Some(name), _) => attached.iter().find(|a| a.name() == name).ok_or_else(|| {
            format!(
                "No environment named {name:?} is attached. Attached: {}.",
                names()
            )
        }),
        (None, [only]) => Ok(only),
        (None, _) => Err(format!(
            "Several environments are attached ({}): pass environment.",
            names()
        )),
    }
}

/// The call's arguments without `environment` (runners do not take it).
pub fn strip_environment_argument(arguments: &Value) -> (Option<String>, Value) {
    let mut arguments = arguments.clone();
    let requested = arguments
        .as_object_mut()
        .and_then(|o| o.remove("environment"))
        .and_then(|v| v.as_str().map(str::to_string));
    (requested, arguments)
}

/// `Environment "api" (local, macOS, /Users/ana/src/api) attached.` plus what was loaded.
pub fn attached_text(attachment: &Attachment) -> String {
    let env = &attachment.environment;
    let mut text = format!(
        "Environment {:?} ({}, {}, {}) attached on runner {:?}.",
        env.name,
        env.kind.as_str(),
        env.os,
        env.root,
        attachment.runner
    );
    if let Some(branch) = &env.branch {
        text.push_str(&format!(" Branch {branch}."));
    }
    if env.agents_md.is_some() {
        text.push_str(&format!(" {} found — loading context.", env.agents_file()));
    }
    text
}

/// `Environment "api" detached.` plus the kept branch.
pub fn detached_text(name: &str, branch: Option<&str>, problem: Option<&str>) -> String {
    let mut text = format!("Environment {name:?} detached.");
    if let Some(branch) = branch {
        text.push_str(&format!(" Branch {branch} was kept."));
    }
    if let Some(problem) = problem {
        text.push_str(&format!(" (The runner reported: {problem}.)"));
    }
    text
}

/// The note the agent gets after a runner reconnected or the session resumed, with what the
/// snapshot validation found stale.
pub fn resume_note(name: &str, stale: &[StaleItem]) -> String {
    if stale.is_empty() {
        format!(
            "Resumed: environment {name:?} is available again; its snapshot (cwd, environment variables) is still valid."
        )
    } else {
        let items: Vec<String> = stale.iter().map(StaleItem::describe).collect();
        format!(
            "Resumed: environment {name:?} is available again, but its snapshot is stale: {}. Commands may behave differently than before.",
            items.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::runner::{EnvironmentKind, Snapshot, StaleKind};

    fn attachment(name: &str) -> Attachment {
        Attachment {
            environment: AttachedEnvironment {
                name: name.into(),
                kind: EnvironmentKind::Local,
                root: format!("/src/{name}"),
                os: "macOS".into(),
                repo_path: None,
                branch: None,
                cell: Default::default(),
                snapshot: Snapshot::default(),
                agents_md: Some("# hi".into()),
                agents_md_truncated: false,
                agents_md_file: None,
            },
            runner: "mac".into(),
            runner_owner: "ana".into(),
            runner_kind: RunnerKind::Local,
            definition_id: None,
            definition_name: None,
            secrets: Vec::new(),
            cost_per_hour_usd: None,
            mcp_servers: Vec::new(),
            attached_at: 0,
        }
    }

    #[test]
    fn picking_targets() {
        let none: Vec<Attachment> = vec![];
        let one = vec![attachment("api")];
        let two = vec![attachment("api"), attachment("web")];
        assert!(
            pick(&none, None)
                .unwrap_err()
                .contains("request_environment")
        );
        assert_eq!(pick(&one, None).unwrap().name(), "api");
        assert_eq!(pick(&two, Some("web")).unwrap().name(), "web");
        assert!(pick(&two, None).unwrap_err().contains("\"api\", \"web\""));
        assert!(
            pick(&two, Some("db"))
                .unwrap_err()
                .contains("No environment named \"db\"")
        );
    }

    #[test]
    fn texts() {
        assert_eq!(
            attached_text(&attachment("api")),
            "Environment \"api\" (local, macOS, /src/api) attached on runner \"mac\". AGENTS.md found — loading context."
        );
        let mut claude = attachment("api");
        claude.environment.agents_md_file = Some("CLAUDE.md".into());
        assert!(attached_text(&claude).ends_with("CLAUDE.md found — loading context."));
        assert_eq!(
            detached_text("wt", Some("wuhu/abc"), None),
            "Environment \"wt\" detached. Branch wuhu/abc was kept."
        );
        let stale = [StaleItem {
            kind: StaleKind::Cwd,
            path: "/gone".into(),
        }];
        assert!(resume_note("api", &stale).contains("working directory /gone no longer exists"));
        let (env, args) =
            strip_environment_argument(&serde_json::json!({"command": "ls", "environment": "api"}));
        assert_eq!(
            (env.as_deref(), args),
            (Some("api"), serde_json::json!({"command": "ls"}))
        );
    }
}
