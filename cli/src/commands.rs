//! Every command but `chat`: argument types and what each one does.

use std::io::{IsTerminal, Read, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use wuhu_client::{Client, FollowEvent, FollowOptions};
use wuhu_core::approvals::Answer;
use wuhu_core::secrets::{PutSecretRequest, SecretScope};
use wuhu_core::wire::{
    ApprovalPolicy, CreateEnvironmentRequest, CreateSessionRequest, Entry, Lane, MintTokenRequest,
    PatchSessionRequest, StreamEvent, UpdateEnvironmentRequest,
};

use crate::config::{self, Inputs, Resolved};
use crate::render::{self, Renderer, Style, summarize};
use crate::token::{self, MintRequest};
use crate::{Cli, Command, Global, exit};

/// An error with a chosen exit code (client-side conditions the server never saw).
#[derive(Debug)]
pub struct Exit {
    /// Exit code.
    pub code: u8,
    /// Message.
    pub message: String,
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

fn usage(message: impl Into<String>) -> anyhow::Error {
    Exit {
        code: exit::USAGE,
        message: message.into(),
    }
    .into()
}

/// Asks `question` on the terminal (`[y/N]`); without a terminal the answer is no (a script
/// passes `--yes`).
fn confirm(question: &str) -> Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("cannot read the answer from stdin")?;
    Ok(matches!(line.trim(), "y" | "Y" | "yes"))
}

/// The exit code and the text to print for an error (JSON text under `--json` is the caller's
/// choice: this returns the human text; see [`error_json`]).
pub fn describe_error(error: &anyhow::Error) -> (u8, String) {
    let code = exit_code(error);
    if crate::Cli::json_requested() {
        return (code, error_json(error, code).to_string());
    }
    (code, format!("{error:#}"))
}

fn exit_code(error: &anyhow::Error) -> u8 {
    if let Some(exit) = error.downcast_ref::<Exit>() {
        return exit.code;
    }
    match error.downcast_ref::<wuhu_client::Error>() {
        Some(wuhu_client::Error::Api { status, .. }) => match status {
            400 | 413 | 422 => exit::USAGE,
            401 | 403 => exit::AUTH,
            404 => exit::NOT_FOUND,
            _ => exit::SERVER,
        },
        Some(wuhu_client::Error::InvalidUrl { .. }) => exit::USAGE,
        Some(_) => exit::SERVER,
        // Local failures (files, stdin) are the caller's to fix.
        None => exit::USAGE,
    }
}

/// `{"error":{"code","message","status","exit"}}` for `--json`.
fn error_json(error: &anyhow::Error, exit_code: u8) -> Value {
    let (code, status) = match error.downcast_ref::<wuhu_client::Error>() {
        Some(e @ wuhu_client::Error::Api { code, .. }) => (code.clone(), e.status()),
        Some(wuhu_client::Error::Transport(_)) => ("unreachable".to_string(), None),
        Some(e) => ("client".to_string(), e.status()),
        None => (
            match exit_code {
                exit::AUTH => "not_logged_in",
                _ => "usage",
            }
            .to_string(),
            None,
        ),
    };
    json!({"error": {"code": code, "message": format!("{error:#}"), "status": status, "exit": exit_code}})
}

impl Cli {
    /// Whether `--json` is on the command line (read again for errors, which are printed after
    /// the parsed command is gone).
    pub fn json_requested() -> bool {
        std::env::args().any(|a| a == "--json")
    }
}

/// `wuhu sessions …`.
#[derive(Subcommand, Debug)]
pub enum SessionsCommand {
    /// Newest first.
    List {
        /// Page size (1–200).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Start after this session id (a previous page's `nextBefore`).
        #[arg(long)]
        before: Option<String>,
    },
    /// Create a session.
    #[command(visible_alias = "create")]
    New {
        /// Title.
        #[arg(long)]
        title: Option<String>,
        /// Provider (`anthropic`, `openai`, `openai-compatible`, `fake`).
        #[arg(long)]
        provider: Option<String>,
        /// Model.
        #[arg(long)]
        model: Option<String>,
        /// System prompt.
        #[arg(long)]
        system_prompt: Option<String>,
        #[command(flatten)]
        reasoning: ReasoningArgs,
    },
    /// Switch the session's model or reasoning (`PATCH`): what is not named stays.
    Model {
        /// Session id.
        id: String,
        /// Switch to this provider (without --model: its default model).
        #[arg(long)]
        provider: Option<String>,
        /// Switch to this model.
        #[arg(long)]
        model: Option<String>,
        #[command(flatten)]
        reasoning: ReasoningArgs,
        /// Remove the reasoning setting (the provider's default again).
        #[arg(long, conflicts_with_all = ["reasoning_effort", "thinking_budget"])]
        no_reasoning: bool,
    },
    /// The session, its transcript and its queue.
    Show {
        /// Session id.
        id: String,
        /// Only entries after this cursor.
        #[arg(long, default_value_t = 0)]
        since: u64,
    },
    /// Stream the session's events (resumes by itself after a dropped connection).
    Follow {
        /// Session id.
        id: String,
        /// End when the session is idle.
        #[arg(long)]
        until_idle: bool,
        /// Start after this cursor (default: the whole transcript).
        #[arg(long, default_value_t = 0)]
        since: u64,
        /// End after this many seconds.
        #[arg(long)]
        timeout: Option<u64>,
    },
    /// Queue a message (`-` reads it from stdin).
    Send {
        /// Session id.
        id: String,
        /// The message.
        message: String,
        /// `followUp` (default: after the current turn) or `steer` (at the next step).
        #[arg(long, default_value = "followUp", value_parser = ["followUp", "steer"])]
        lane: String,
        /// Then follow the session until it is idle.
        #[arg(long)]
        wait: bool,
        /// For this message's turn only (the session's setting otherwise).
        #[command(flatten)]
        reasoning: ReasoningArgs,
    },
    /// Stop the current turn.
    Stop {
        /// Session id.
        id: String,
    },
    /// Withdraw a queued message not yet delivered.
    Cancel {
        /// Session id.
        id: String,
        /// Queue item id (printed by `send`).
        item: String,
    },
    /// Change the title.
    Rename {
        /// Session id.
        id: String,
        /// New title.
        title: String,
    },
    /// Delete a session, its children and everything stored for it (its owner or an admin).
    Rm {
        /// Session id.
        id: String,
    },
    /// A new session whose history is this one's first N entries (`POST …/fork`).
    Fork {
        /// Session id.
        id: String,
        /// Keep the entries up to and including this cursor (default: all of them).
        #[arg(long)]
        at: Option<u64>,
        /// The fork's title (default: the session's).
        #[arg(long)]
        title: Option<String>,
    },
    /// Compact the context now: one summary request replaces the older part (`POST …/compact`).
    Compact {
        /// Session id.
        id: String,
        /// What the summary should focus on.
        #[arg(long)]
        instructions: Option<String>,
    },
    /// Tokens and cost per model, policy decisions, MCP calls and the session's budget.
    Usage {
        /// Session id.
        id: String,
    },
}

/// `wuhu channels …` (admins; docs/channels.md).
#[derive(Subcommand, Debug)]
pub enum ChannelsCommand {
    /// The tenant's bindings: id, platform, name, who is let in, the webhook URL.
    List,
    /// One binding, credentials masked, with its setup steps.
    Show {
        /// Binding id.
        id: String,
    },
    /// Create a binding from its JSON (docs/api.md, "Channels") read from stdin, so its
    /// credentials never appear on a command line; prints where to paste what.
    Add,
    /// Delete a binding (its hook then answers 401).
    Rm {
        /// Binding id.
        id: String,
    },
    /// Who is who: platform user ids mapped to Wuhu names. With `--map USER=SUB` (repeatable)
    /// replaces the whole list; `--clear` empties it.
    Members {
        /// Binding id.
        id: String,
        /// `USER=SUB`: the platform's user id and the Wuhu name it acts as.
        #[arg(long = "map", value_name = "USER=SUB")]
        map: Vec<String>,
        /// Remove every mapping.
        #[arg(long, conflicts_with = "map")]
        clear: bool,
    },
}

/// `wuhu jobs`: a session's background jobs.
#[derive(Args, Debug)]
pub struct JobsArgs {
    /// Session id.
    pub session: String,
    /// Also print each job's output tail.
    #[arg(long)]
    pub output: bool,
}

/// `wuhu usage`: what the tenant's sessions used (a member's own sessions).
#[derive(Args, Debug)]
pub struct UsageArgs {
    /// Group by `session`, `user`, `model` or `day` (UTC days, oldest first).
    #[arg(long, value_parser = ["session", "user", "model", "day"], default_value = "model")]
    pub by: String,
    /// From this Unix time (seconds; default: the beginning).
    #[arg(long)]
    pub from: Option<u64>,
    /// Up to this Unix time (seconds; default: the current hour).
    #[arg(long)]
    pub to: Option<u64>,
}

/// `wuhu budget`: the tenant's budget; with a limit (admins), sets it.
#[derive(Args, Debug)]
pub struct BudgetArgs {
    /// Most input plus output tokens.
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// Most US dollars.
    #[arg(long)]
    pub max_usd: Option<f64>,
    /// Remove the budget.
    #[arg(long, conflicts_with_all = ["max_tokens", "max_usd"])]
    pub clear: bool,
}

/// A reasoning setting (`{"effort", "budgetTokens"?}`): how much the model thinks.
#[derive(Args, Debug, Default)]
pub struct ReasoningArgs {
    /// How hard the model thinks: `low`, `medium` or `high` (reasoning models only).
    #[arg(long, value_parser = ["low", "medium", "high"])]
    pub reasoning_effort: Option<String>,
    /// Anthropic models: the thinking budget in tokens (1024 up to the model's output limit
    /// less 1024).
    #[arg(long, requires = "reasoning_effort")]
    pub thinking_budget: Option<u32>,
}

impl ReasoningArgs {
    /// The setting, when one was given.
    pub fn setting(&self) -> Option<wuhu_core::llm::reasoning::Reasoning> {
        use wuhu_core::llm::reasoning::{Effort, Reasoning};
        let effort = match self.reasoning_effort.as_deref()? {
            "low" => Effort::Low,
            "medium" => Effort::Medium,
            _ => Effort::High,
        };
        Some(Reasoning {
            effort,
            budget_tokens: self.thinking_budget,
        })
    }
}

/// `high effort` / `high effort, 8192 thinking tokens` / `default`.
fn describe_reasoning(reasoning: Option<&wuhu_core::llm::reasoning::Reasoning>) -> String {
    match reasoning {
        None => "default reasoning".into(),
        Some(r) => match r.budget_tokens {
            None => format!("{} reasoning effort", r.effort.as_str()),
            Some(budget) => format!(
                "{} reasoning effort, {budget} thinking tokens",
                r.effort.as_str()
            ),
        },
    }
}

/// Fields of an environment definition, for `add` and `edit`.
#[derive(Args, Debug, Default)]
pub struct EnvFields {
    /// `local`, `folder-template` or `worktree`.
    #[arg(long)]
    pub kind: Option<String>,
    /// Runner name.
    #[arg(long)]
    pub runner: Option<String>,
    /// Whose runner `--runner` is.
    #[arg(long)]
    pub runner_owner: Option<String>,
    /// `local`: directory on the runner.
    #[arg(long)]
    pub path: Option<String>,
    /// `folder-template`: template directory.
    #[arg(long)]
    pub template_path: Option<String>,
    /// `folder-template`: startup script.
    #[arg(long)]
    pub startup_script: Option<String>,
    /// `worktree`: repository path.
    #[arg(long)]
    pub repo_path: Option<String>,
    /// `worktree`: base ref.
    #[arg(long)]
    pub base_ref: Option<String>,
    /// `auto` or `ask`.
    #[arg(long, value_parser = ["auto", "ask"])]
    pub approval: Option<String>,
    /// Extra variable names for the snapshot whitelist (repeatable).
    #[arg(long = "extra-env-var")]
    pub extra_env_vars: Vec<String>,
    /// The cell's network: `none`, `open`, or `allow:HOST,HOST,…` (`*.example.com`,
    /// `host:port`, addresses and ranges).
    #[arg(long, value_name = "NETWORK")]
    pub network: Option<String>,
    /// A directory the cell may read and run besides the system's (repeatable).
    #[arg(long = "read-only-path", value_name = "PATH")]
    pub read_only_paths: Vec<String>,
    /// A secret its commands get as an environment variable (repeatable; `wuhu secrets`).
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// A stdio MCP server its runner starts when a session first uses it, as JSON
    /// (`{"name":"every","command":"npx","args":["-y","pkg"]}`; repeatable; docs/mcp.md).
    #[arg(long = "mcp-server", value_name = "JSON")]
    pub mcp_servers: Vec<String>,
    /// What an hour of it costs in US dollars (a policy's `costUsdOver` sees the estimate).
    #[arg(long = "cost-per-hour-usd", value_name = "USD")]
    pub cost_per_hour_usd: Option<f64>,
}

/// `--cost-per-hour-usd` as the wire's number (the server checks its range).
fn cost_number(cost: Option<f64>) -> Result<Option<serde_json::Number>> {
    cost.map(|c| {
        serde_json::Number::from_f64(c)
            .ok_or_else(|| usage("--cost-per-hour-usd must be a number of dollars"))
    })
    .transpose()
}

/// `--mcp-server JSON`, each a stdio server (`None` when none is given: the list is kept).
fn mcp_servers(texts: &[String]) -> Result<Option<Vec<wuhu_core::wire::runner::mcp::StdioServer>>> {
    if texts.is_empty() {
        return Ok(None);
    }
    texts
        .iter()
        .map(|text| {
            serde_json::from_str(text).map_err(|e| usage(format!("--mcp-server {text:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// `--network`: `none`, `open` or `allow:HOST,…`.
fn parse_network(text: &str) -> Result<wuhu_core::cell::Network> {
    use wuhu_core::cell::Network;
    match text {
        "none" => Ok(Network::None),
        "open" => Ok(Network::Open),
        other => match other.strip_prefix("allow:") {
            Some(hosts) => Ok(Network::Allow(
                hosts
                    .split(',')
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(String::from)
                    .collect(),
            )),
            None => Err(usage(format!(
                "--network must be none, open or allow:HOST,HOST,… not {other:?}"
            ))),
        },
    }
}

/// `wuhu envs …`.
#[derive(Subcommand, Debug)]
pub enum EnvsCommand {
    /// All definitions.
    List,
    /// Create a definition.
    Add {
        /// Name.
        name: String,
        /// Fields.
        #[command(flatten)]
        fields: Box<EnvFields>,
    },
    /// Change a definition.
    Edit {
        /// Id or name.
        name: String,
        /// New name.
        #[arg(long)]
        rename: Option<String>,
        /// Fields to clear (runner, runner-owner, path, template-path, startup-script, repo-path,
        /// base-ref, network, cost-per-hour-usd) and lists to empty (secrets, read-only-paths,
        /// extra-env-vars); repeatable. A list flag (`--secret`, …) replaces its whole list.
        #[arg(long)]
        unset: Vec<String>,
        /// Fields.
        #[command(flatten)]
        fields: Box<EnvFields>,
    },
    /// Delete a definition.
    Rm {
        /// Id or name.
        name: String,
    },
}

/// `wuhu runners …`.
#[derive(Subcommand, Debug)]
pub enum RunnersCommand {
    /// Every runner of the tenant.
    List,
}

/// `wuhu approvals …`.
#[derive(Subcommand, Debug)]
pub enum ApprovalsCommand {
    /// Approvals waiting for an answer (in SESSION, or in every running session).
    List {
        /// Session id.
        session: Option<String>,
    },
    /// Let the call run.
    Approve {
        /// Session id.
        session: String,
        /// Approval id.
        approval: String,
        /// Also stop asking this runner owner in this session.
        #[arg(long, conflicts_with = "always")]
        for_session: bool,
        /// A policy's ask about your own machine: also allow this exact command (path, host)
        /// there from now on (a rule first in your `users/<you>/policy.json`).
        #[arg(long)]
        always: bool,
    },
    /// Refuse the call.
    Deny {
        /// Session id.
        session: String,
        /// Approval id.
        approval: String,
    },
}

/// `wuhu docs …`.
#[derive(Subcommand, Debug)]
pub enum DocsCommand {
    /// Documents under PREFIX.
    Ls {
        /// Path prefix.
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Print a document.
    Get {
        /// Path.
        path: String,
    },
    /// Write a document from FILE (or stdin).
    Put {
        /// Path.
        path: String,
        /// File to upload (`-` or absent: stdin).
        file: Option<String>,
    },
    /// Delete a document.
    Rm {
        /// Path.
        path: String,
    },
}

/// `wuhu secrets …`.
#[derive(Subcommand, Debug)]
pub enum SecretsCommand {
    /// The tenant's secrets and your own: names, scopes, where they may go (never values).
    List,
    /// Set secret NAME; the value is read from stdin (never from the command line, where other
    /// users and shell history could see it).
    Set {
        /// An environment variable name (`GITHUB_TOKEN`).
        name: String,
        /// The tenant's secret (admins) instead of your own.
        #[arg(long)]
        tenant: bool,
        /// Environment definitions whose commands may get it (repeatable).
        #[arg(long = "environment", value_name = "DEFINITION")]
        environments: Vec<String>,
        /// Hosts `js` fetch may send it to (repeatable).
        #[arg(long = "host", value_name = "HOST")]
        hosts: Vec<String>,
    },
    /// Delete secret NAME.
    Rm {
        /// Its name.
        name: String,
        /// The tenant's secret (admins) instead of your own.
        #[arg(long)]
        tenant: bool,
    },
}

/// `wuhu policy …`.
#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// A dry run: what the policies would decide on a call (nothing runs). The policies
    /// themselves are workspace documents: `wuhu docs put config/policy.json` (admins) and
    /// `users/<you>/policy.json`.
    Check {
        /// The tool (`bash`, `write`, `edit`, `js_fetch`, `request_environment`, …).
        #[arg(long, default_value = "bash")]
        tool: String,
        /// A `bash` command.
        #[arg(long)]
        command: Option<String>,
        /// A file path.
        #[arg(long)]
        path: Option<String>,
        /// A fetch's host.
        #[arg(long)]
        host: Option<String>,
        /// The environment's name.
        #[arg(long)]
        environment: Option<String>,
        /// The runner's name.
        #[arg(long)]
        runner: Option<String>,
        /// The runner's owner, whose own policy is read too.
        #[arg(long)]
        runner_owner: Option<String>,
        /// An MCP tool, as `<server>/<tool>` (with `--tool mcp_call`).
        #[arg(long)]
        mcp: Option<String>,
        /// The call's cost estimate in US dollars.
        #[arg(long)]
        cost_usd: Option<f64>,
    },
}

/// `wuhu mcp …`.
#[derive(Subcommand, Debug)]
pub enum McpCommand {
    /// The MCP servers your own turns would use, and documents that cannot be used. The lists
    /// themselves are workspace documents: `wuhu docs put config/mcp.json` (admins) and
    /// `users/<you>/mcp.json`.
    List,
    /// Asks a server for its tools now, as your own turn would.
    Tools {
        /// The server's name.
        #[arg(value_name = "SERVER")]
        name: String,
    },
    /// Starts your OAuth sign-in to a server whose entry says `"auth": {"type": "oauth"}`:
    /// prints the address to open in your browser.
    Connect {
        /// The server's name.
        #[arg(value_name = "SERVER")]
        name: String,
    },
    /// Forgets your OAuth connection to a server.
    Disconnect {
        /// The server's name.
        #[arg(value_name = "SERVER")]
        name: String,
    },
}

/// `wuhu token …`.
#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Sign a token with the server's secret (operators only).
    Mint {
        /// The server's WUHU_JWT_SECRET.
        #[arg(long, env = "WUHU_JWT_SECRET", hide_env_values = true)]
        secret: String,
        /// Username.
        #[arg(long)]
        sub: String,
        /// Tenant.
        #[arg(long)]
        tenant: String,
        /// Lifetime in days.
        #[arg(long, default_value_t = 30.0)]
        days: f64,
        /// `admin` or `member`.
        #[arg(long)]
        role: Option<String>,
        /// A runner token.
        #[arg(long)]
        runner: bool,
        /// `local` or `cloud` (implies --runner).
        #[arg(long)]
        runner_kind: Option<String>,
    },
    /// Your tokens and browser sessions registered with the server (`GET /v1/tokens`).
    List,
    /// Revoke a registered token or browser session at once, with everything made from it
    /// (`DELETE /v1/tokens/JTI`).
    Revoke {
        /// The token's id (`wuhu token list`).
        jti: String,
    },
    /// Sign out everywhere: end every registered token and browser session of yours (admins:
    /// of USER) and everything made from them (`POST /v1/tokens/revoke-all`). This profile's
    /// token too, if it is a registered one.
    RevokeAll {
        /// Another user's (admins only).
        #[arg(long, value_name = "USER")]
        sub: Option<String>,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

/// Runs a parsed command; returns the exit code.
///
/// # Errors
/// Whatever the command failed with (see [`describe_error`]).
pub async fn run(cli: Cli) -> Result<u8> {
    let global = cli.global;
    match cli.command {
        Command::Token(TokenCommand::Mint {
            secret,
            sub,
            tenant,
            days,
            role,
            runner,
            runner_kind,
        }) => {
            let request = MintRequest {
                sub,
                tenant,
                days,
                role,
                runner,
                runner_kind,
            };
            let claims = token::claims(&request, unix_now()).map_err(|e| usage(e.to_string()))?;
            if secret.len() < token::MIN_SECRET_BYTES {
                eprintln!(
                    "wuhu: warning: the server refuses secrets shorter than {} bytes",
                    token::MIN_SECRET_BYTES
                );
            }
            let token = token::sign(secret.as_bytes(), &claims)?;
            if global.json {
                print_json(&json!({"token": token, "claims": claims}));
            } else {
                println!("{token}");
            }
            Ok(exit::OK)
        }
        Command::Login {
            no_verify,
            mint,
            ttl_days,
        } => login(&global, no_verify, mint, ttl_days).await,
        Command::Token(TokenCommand::List) => {
            let client = connect(&global)?;
            let tokens = client.list_tokens().await?;
            if global.json {
                print_json(&tokens);
            } else {
                let rows = tokens.tokens.iter().map(|t| {
                    let name = if t.current {
                        format!("{} (this one)", t.name)
                    } else {
                        t.name.clone()
                    };
                    vec![
                        t.jti.clone(),
                        name,
                        t.kind.as_str().to_string(),
                        t.sub.clone(),
                        t.role.as_str().to_string(),
                        ago(t.created_at),
                        t.parent.clone().unwrap_or_else(|| "-".to_string()),
                    ]
                });
                table(
                    &["JTI", "NAME", "KIND", "SUB", "ROLE", "CREATED", "PARENT"],
                    rows,
                );
            }
            Ok(exit::OK)
        }
        Command::Token(TokenCommand::Revoke { jti }) => {
            let client = connect(&global)?;
            let answer = client.revoke_token(&jti).await?;
            if global.json {
                print_json(&answer);
            } else {
                let also = answer["alsoRevoked"].as_u64().unwrap_or(0);
                if also > 0 {
                    println!("Revoked {jti} and {also} credential(s) made from it");
                } else {
                    println!("Revoked {jti}");
                }
            }
            Ok(exit::OK)
        }
        Command::Token(TokenCommand::RevokeAll { sub, yes }) => {
            let client = connect(&global)?;
            if !yes {
                let whose = sub
                    .as_deref()
                    .map_or("your".to_string(), |s| format!("{s}'s"));
                if !confirm(&format!(
                    "End every registered token and browser session of {whose}, and everything made from them?"
                ))? {
                    return Err(usage("not confirmed (pass --yes to skip the question)"));
                }
            }
            let answer = client.revoke_all_tokens(sub.as_deref()).await?;
            if global.json {
                print_json(&answer);
            } else {
                println!(
                    "Ended {} credential(s) of {} ({} browser session(s)); {} runner connection(s) closed",
                    answer.revoked, answer.sub, answer.sessions, answer.runner_connections_closed
                );
            }
            Ok(exit::OK)
        }
        Command::Logout => logout(&global),
        Command::Whoami => whoami(&global).await,
        Command::Chat(args) => {
            let client = connect(&global)?;
            crate::chat::run(client, args, global.json).await
        }
        Command::Sessions(command) => sessions(&global, command).await,
        Command::Envs(command) => envs(&global, command).await,
        Command::Runners(RunnersCommand::List) => {
            let client = connect(&global)?;
            let runners = client.list_runners().await?;
            if global.json {
                print_json(&runners);
            } else {
                let rows = runners.runners.iter().map(|r| {
                    vec![
                        r.name.clone(),
                        r.owner.clone(),
                        format!("{:?}", r.kind).to_lowercase(),
                        format!("{}/{}", r.os, r.arch),
                        if r.connected { "connected" } else { "offline" }.to_string(),
                        ago(r.last_seen),
                        r.environments
                            .iter()
                            .map(|e| e.name.as_str())
                            .collect::<Vec<_>>()
                            .join(","),
                    ]
                });
                table(
                    &["NAME", "OWNER", "KIND", "PLATFORM", "STATE", "SEEN", "ENVS"],
                    rows,
                );
            }
            Ok(exit::OK)
        }
        Command::Approvals(command) => approvals(&global, command).await,
        Command::Docs(command) => docs(&global, command).await,
        Command::Secrets(command) => secrets(&global, command).await,
        Command::Policy(command) => policy(&global, command).await,
        Command::Usage(args) => tenant_usage(&global, args).await,
        Command::Jobs(args) => jobs(&global, args).await,
        Command::Channels(command) => channels(&global, command).await,
        Command::Budget(args) => budget(&global, args).await,
        Command::Mcp(command) => mcp(&global, command).await,
    }
}

/// The configuration file, its path and what this command resolves to.
fn resolve(global: &Global) -> Result<(std::path::PathBuf, config::ConfigFile, Resolved)> {
    let path = config::config_path().map_err(|e| usage(format!("{e:#}")))?;
    let file = config::load(&path).map_err(|e| usage(format!("{e:#}")))?;
    let inputs = Inputs::from_env(
        global.server.clone(),
        global.token.clone(),
        global.profile.clone(),
    );
    let resolved = file.resolve(&inputs);
    Ok((path, file, resolved))
}

/// A client for a command that needs a token.
fn connect(global: &Global) -> Result<Client> {
    let (_, _, resolved) = resolve(global)?;
    if resolved.token.is_none() {
        return Err(Exit {
            code: exit::AUTH,
            message: format!(
                "not logged in (profile {:?}): run `wuhu login --server URL` or set WUHU_TOKEN",
                resolved.profile
            ),
        }
        .into());
    }
    Ok(Client::new(&resolved.server, resolved.token)?)
}

async fn login(
    global: &Global,
    no_verify: bool,
    mint: Option<String>,
    ttl_days: Option<i64>,
) -> Result<u8> {
    let (path, mut file, resolved) = resolve(global)?;
    let token = match &global.token {
        Some(token) => token.clone(),
        None => {
            if std::io::stdin().is_terminal() {
                eprint!("Paste a token for {}: ", resolved.server);
                let _ = std::io::stderr().flush();
            }
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("cannot read the token from stdin")?;
            line.trim().to_string()
        }
    };
    if token.is_empty() {
        return Err(usage("no token given (pass --token or paste one on stdin)"));
    }
    let mut token = token;
    let mut minted = None;
    if let Some(name) = mint {
        // The given token is used once, to mint; only the minted (revocable) one is saved.
        let client = Client::new(&resolved.server, Some(token.clone()))?;
        let answer = client
            .mint_token(&MintTokenRequest {
                name,
                kind: wuhu_core::wire::MintKind::User,
                ttl_days,
                sub: None,
                role: None,
                runner_kind: None,
            })
            .await?;
        token = answer.token;
        minted = Some(answer.info);
    }
    let claims = token::read_claims(&token).map_err(|e| usage(format!("{e:#}")))?;
    let client = Client::new(&resolved.server, Some(token.clone()))?;
    if !no_verify && minted.is_none() {
        client.list_sessions(Some(1), None).await?;
    }
    let profile = file.profiles.entry(resolved.profile.clone()).or_default();
    profile.server = Some(resolved.server.clone());
    profile.token = Some(token);
    file.current = Some(resolved.profile.clone());
    config::save(&path, &file)?;
    let who = format!(
        "{}@{}",
        claims["sub"].as_str().unwrap_or("?"),
        claims["tenant"].as_str().unwrap_or("?")
    );
    if global.json {
        print_json(&json!({
            "profile": resolved.profile,
            "server": resolved.server,
            "sub": claims["sub"],
            "tenant": claims["tenant"],
            "verified": !no_verify,
            "minted": minted,
            "config": path,
        }));
    } else {
        if let Some(info) = &minted {
            println!(
                "Minted token {:?} (jti {}, revoke with `wuhu token revoke {}`)",
                info.name, info.jti, info.jti
            );
        }
        println!(
            "Logged in to {} as {who} (profile {}, saved in {})",
            resolved.server,
            resolved.profile,
            path.display()
        );
    }
    Ok(exit::OK)
}

fn logout(global: &Global) -> Result<u8> {
    let (path, mut file, resolved) = resolve(global)?;
    let removed = file
        .profiles
        .get_mut(&resolved.profile)
        .and_then(|p| p.token.take())
        .is_some();
    if removed {
        config::save(&path, &file)?;
    }
    if global.json {
        print_json(&json!({"profile": resolved.profile, "removed": removed}));
    } else if removed {
        println!("Removed the token of profile {}", resolved.profile);
    } else {
        println!("Profile {} has no token", resolved.profile);
    }
    Ok(exit::OK)
}

async fn whoami(global: &Global) -> Result<u8> {
    let (path, _, resolved) = resolve(global)?;
    let client = connect(global)?;
    let token = client.token().unwrap_or_default();
    let claims = token::read_claims(token).map_err(|e| Exit {
        code: exit::AUTH,
        message: format!("{e:#}"),
    })?;
    // The server is the judge: an accepted token lists sessions.
    client.list_sessions(Some(1), None).await?;
    if global.json {
        print_json(&json!({
            "server": resolved.server,
            "serverSource": resolved.server_source,
            "profile": resolved.profile,
            "tokenSource": resolved.token_source,
            "config": path,
            "sub": claims["sub"],
            "tenant": claims["tenant"],
            "role": claims.get("role").cloned().unwrap_or(json!("member")),
            "exp": claims["exp"],
            "accepted": true,
        }));
    } else {
        let exp = claims["exp"].as_i64().unwrap_or(0);
        println!(
            "{}@{} ({}) on {}",
            claims["sub"].as_str().unwrap_or("?"),
            claims["tenant"].as_str().unwrap_or("?"),
            claims["role"].as_str().unwrap_or("member"),
            resolved.server
        );
        println!(
            "token from {:?}, server from {:?} (profile {}); expires in {}",
            resolved.token_source,
            resolved.server_source,
            resolved.profile,
            duration_text(exp - unix_now())
        );
    }
    Ok(exit::OK)
}

async fn sessions(global: &Global, command: SessionsCommand) -> Result<u8> {
    let client = connect(global)?;
    let style = Style::detect(global.json);
    match command {
        SessionsCommand::List { limit, before } => {
            let page = client.list_sessions(Some(limit), before.as_deref()).await?;
            if global.json {
                print_json(&page);
            } else {
                let rows = page.sessions.iter().map(|s| {
                    vec![
                        s.id.clone(),
                        s.status.as_str().to_string(),
                        s.owner.clone(),
                        ago(s.updated_at),
                        s.title.clone().unwrap_or_default(),
                    ]
                });
                table(&["ID", "STATUS", "OWNER", "UPDATED", "TITLE"], rows);
                if let Some(next) = page.next_before {
                    println!("{}", style.dim(&format!("more: --before {next}")));
                }
            }
        }
        SessionsCommand::New {
            title,
            provider,
            model,
            system_prompt,
            reasoning,
        } => {
            let session = client
                .create_session(&CreateSessionRequest {
                    provider,
                    model,
                    system_prompt,
                    title,
                    budget: None,
                    reasoning: reasoning.setting(),
                })
                .await?;
            if global.json {
                print_json(&session);
            } else {
                println!("{}", session.id);
            }
        }
        SessionsCommand::Show { id, since } => {
            let page = client.transcript(&id, since).await?;
            if global.json {
                print_json(&page);
            } else {
                let s = &page.session;
                println!(
                    "{} {}",
                    style.bold(s.title.as_deref().unwrap_or("(untitled)")),
                    style.dim(&s.id)
                );
                let reasoning = match &s.reasoning {
                    Some(r) => format!(" ({})", describe_reasoning(Some(r))),
                    None => String::new(),
                };
                println!(
                    "{} · {}/{}{reasoning} · owner {} · {} · updated {}",
                    s.status.as_str(),
                    s.provider,
                    s.model,
                    s.owner,
                    format!("{:?}", s.access).to_lowercase(),
                    ago(s.updated_at)
                );
                let mut renderer = Renderer::new(style);
                let mut out = std::io::stdout().lock();
                for entry in &page.transcript {
                    renderer.entry(&mut out, entry)?;
                }
                for item in &page.queue {
                    writeln!(
                        out,
                        "{}",
                        style.dim(&format!(
                            "queued {} ({:?}) {}: {}",
                            item.id,
                            item.lane,
                            item.author,
                            summarize(&item.content, 60)
                        ))
                    )?;
                }
            }
        }
        SessionsCommand::Follow {
            id,
            until_idle,
            since,
            timeout,
        } => {
            let options = FollowOptions {
                since_cursor: since,
                stop_after_idle: until_idle,
                timeout: timeout.map(Duration::from_secs),
                ..FollowOptions::default()
            };
            follow(&client, &id, options, global.json, style).await?;
        }
        SessionsCommand::Send {
            id,
            message,
            lane,
            wait,
            reasoning,
        } => {
            let content = if message == "-" {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .context("cannot read the message from stdin")?;
                text
            } else {
                message
            };
            let lane = if lane == "steer" {
                Lane::Steer
            } else {
                Lane::FollowUp
            };
            // Follow from the current end so `--wait` shows only this turn.
            let since = if wait {
                client
                    .session(&id, Default::default())
                    .await?
                    .session
                    .last_cursor
            } else {
                0
            };
            let item = client
                .enqueue_reasoning(&id, lane, &content, reasoning.setting())
                .await?;
            if global.json {
                print_json(&item);
            } else {
                println!("{}", item.id);
            }
            if wait {
                let options = FollowOptions {
                    since_cursor: since,
                    stop_after_idle: true,
                    ..FollowOptions::default()
                };
                follow(&client, &id, options, global.json, style).await?;
            }
        }
        SessionsCommand::Stop { id } => {
            let stopped = client.stop(&id).await?;
            if global.json {
                print_json(&stopped);
            } else {
                println!(
                    "stopped ({} tool call(s) stopped)",
                    stopped.stopped_tool_calls
                );
            }
        }
        SessionsCommand::Cancel { id, item } => {
            let cancelled = client.cancel(&id, &item).await?;
            if global.json {
                print_json(&cancelled);
            } else {
                println!("cancelled {}", cancelled.id);
            }
        }
        SessionsCommand::Fork { id, at, title } => {
            let at_cursor = match at {
                Some(at) => at,
                None => {
                    let query = wuhu_client::TranscriptQuery {
                        limit: Some(1),
                        ..Default::default()
                    };
                    client.session(&id, query).await?.session.last_cursor
                }
            };
            let request = wuhu_core::wire::ForkRequest { at_cursor, title };
            let fork = client.fork_session(&id, &request).await?;
            if global.json {
                print_json(&fork);
            } else {
                println!("{}", fork.id);
                eprintln!("forked {id} at cursor {at_cursor}");
            }
        }
        SessionsCommand::Compact { id, instructions } => {
            let request = wuhu_core::wire::CompactRequest { instructions };
            let done = client.compact(&id, &request).await?;
            if global.json {
                print_json(&done);
            } else {
                println!(
                    "compacted at cursor {}: ~{} tokens before; kept from cursor {}",
                    done.cursor, done.compaction.tokens_before, done.compaction.first_kept_cursor
                );
            }
        }
        SessionsCommand::Usage { id } => {
            let usage = client.session_usage(&id).await?;
            if global.json {
                print_json(&usage);
            } else {
                print_session_usage(&usage);
            }
        }
        SessionsCommand::Rm { id } => {
            let finished = client.delete_session(&id).await?;
            if global.json {
                print_json(&json!({"deleted": id, "finished": finished}));
            } else if finished {
                println!("deleted {id}");
            } else {
                println!("deleting {id} (it finishes in the background)");
            }
        }
        SessionsCommand::Model {
            id,
            provider,
            model,
            reasoning,
            no_reasoning,
        } => {
            let reasoning = match (reasoning.setting(), no_reasoning) {
                (_, true) => Some(None),
                (Some(setting), false) => Some(Some(setting)),
                (None, false) => None,
            };
            let session = client
                .patch_session(
                    &id,
                    &PatchSessionRequest {
                        provider,
                        model,
                        reasoning,
                        ..PatchSessionRequest::default()
                    },
                )
                .await?;
            if global.json {
                print_json(&session);
            } else {
                println!(
                    "{}/{} · {}",
                    session.provider,
                    session.model,
                    describe_reasoning(session.reasoning.as_ref())
                );
            }
        }
        SessionsCommand::Rename { id, title } => {
            let session = client
                .patch_session(
                    &id,
                    &PatchSessionRequest {
                        title: Some(title),
                        ..PatchSessionRequest::default()
                    },
                )
                .await?;
            if global.json {
                print_json(&session);
            } else {
                println!("{}", session.title.unwrap_or_default());
            }
        }
    }
    Ok(exit::OK)
}

/// Prints a follow stream: rendered, or one JSON object per line under `--json` (stream
/// events as the server sends them, plus `{"type":"disconnected"}` / `{"type":"resumed"}`).
async fn follow(
    client: &Client,
    id: &str,
    options: FollowOptions,
    json: bool,
    style: Style,
) -> Result<()> {
    let mut stream = client.follow(id, options);
    let mut renderer = Renderer::new(style);
    while let Some(event) = stream.next().await {
        let event = event?;
        let mut out = std::io::stdout().lock();
        if json {
            writeln!(out, "{}", render::event_json(&event))?;
            out.flush()?;
        } else {
            // Notices go to stderr so piped output stays the transcript.
            if matches!(
                event,
                FollowEvent::Disconnected { .. } | FollowEvent::Resumed { .. }
            ) {
                renderer.line_break(&mut out)?;
                renderer.event(&mut std::io::stderr(), &event)?;
            } else {
                renderer.event(&mut out, &event)?;
            }
        }
        if matches!(event, FollowEvent::Event(StreamEvent::Done)) {
            break;
        }
    }
    let mut out = std::io::stdout().lock();
    renderer.line_break(&mut out)?;
    Ok(())
}

async fn envs(global: &Global, command: EnvsCommand) -> Result<u8> {
    let client = connect(global)?;
    match command {
        EnvsCommand::List => {
            let list = client.list_environments().await?;
            if global.json {
                print_json(&list);
            } else {
                let rows = list.environments.iter().map(|e| {
                    let place = e
                        .path
                        .clone()
                        .or_else(|| e.template_path.clone())
                        .or_else(|| e.repo_path.clone())
                        .unwrap_or_default();
                    vec![
                        e.name.clone(),
                        wuhu_core::wire::kind_name(e.kind).to_string(),
                        e.runner.clone().unwrap_or_else(|| "(cloud)".into()),
                        e.approval.as_str().to_string(),
                        e.owner.clone().unwrap_or_default(),
                        place,
                    ]
                });
                table(
                    &["NAME", "KIND", "RUNNER", "APPROVAL", "OWNER", "PATH"],
                    rows,
                );
            }
        }
        EnvsCommand::Add { name, fields } => {
            let kind = fields
                .kind
                .as_deref()
                .ok_or_else(|| usage("--kind is required (local, folder-template, worktree)"))?;
            let request = CreateEnvironmentRequest {
                name,
                kind: parse_kind(kind)?,
                runner: fields.runner,
                runner_owner: fields.runner_owner,
                path: fields.path,
                template_path: fields.template_path,
                startup_script: fields.startup_script,
                repo_path: fields.repo_path,
                base_ref: fields.base_ref,
                approval: fields.approval.as_deref().map(parse_approval),
                extra_env_vars: (!fields.extra_env_vars.is_empty())
                    .then_some(fields.extra_env_vars),
                network: fields.network.as_deref().map(parse_network).transpose()?,
                read_only_paths: (!fields.read_only_paths.is_empty())
                    .then_some(fields.read_only_paths),
                limits: None,
                secrets: (!fields.secrets.is_empty()).then_some(fields.secrets),
                cost_per_hour_usd: cost_number(fields.cost_per_hour_usd)?,
                mcp_servers: mcp_servers(&fields.mcp_servers)?,
                // Set through the API (`keepWorktree`); no flag yet.
                keep_worktree: None,
            };
            let definition = client.create_environment(&request).await?;
            if global.json {
                print_json(&definition);
            } else {
                println!("{} {}", definition.name, definition.id);
            }
        }
        EnvsCommand::Edit {
            name,
            rename,
            unset,
            fields,
        } => {
            let mut request = UpdateEnvironmentRequest {
                name: rename,
                kind: fields.kind.as_deref().map(parse_kind).transpose()?,
                runner: fields.runner.map(Some),
                runner_owner: fields.runner_owner.map(Some),
                path: fields.path.map(Some),
                template_path: fields.template_path.map(Some),
                startup_script: fields.startup_script.map(Some),
                repo_path: fields.repo_path.map(Some),
                base_ref: fields.base_ref.map(Some),
                approval: fields.approval.as_deref().map(parse_approval),
                extra_env_vars: (!fields.extra_env_vars.is_empty())
                    .then_some(fields.extra_env_vars),
                network: fields
                    .network
                    .as_deref()
                    .map(parse_network)
                    .transpose()?
                    .map(Some),
                read_only_paths: (!fields.read_only_paths.is_empty())
                    .then_some(fields.read_only_paths),
                limits: None,
                secrets: (!fields.secrets.is_empty()).then_some(fields.secrets),
                cost_per_hour_usd: cost_number(fields.cost_per_hour_usd)?.map(Some),
                mcp_servers: mcp_servers(&fields.mcp_servers)?,
                // Set through the API (`keepWorktree`); no flag yet.
                keep_worktree: None,
            };
            for field in &unset {
                let slot = match field.as_str() {
                    "runner" => &mut request.runner,
                    "runner-owner" => &mut request.runner_owner,
                    "path" => &mut request.path,
                    "template-path" => &mut request.template_path,
                    "startup-script" => &mut request.startup_script,
                    "repo-path" => &mut request.repo_path,
                    "base-ref" => &mut request.base_ref,
                    "network" => {
                        request.network = Some(None);
                        continue;
                    }
                    "cost-per-hour-usd" => {
                        request.cost_per_hour_usd = Some(None);
                        continue;
                    }
                    "mcp-servers" => {
                        if request.mcp_servers.is_some() {
                            return Err(usage(
                                "--unset mcp-servers and --mcp-server together: --mcp-server alone replaces the list",
                            ));
                        }
                        request.mcp_servers = Some(Vec::new());
                        continue;
                    }
                    "secrets" | "read-only-paths" | "extra-env-vars" => {
                        let (list, flag) = match field.as_str() {
                            "secrets" => (&mut request.secrets, "--secret"),
                            "read-only-paths" => (&mut request.read_only_paths, "--read-only-path"),
                            _ => (&mut request.extra_env_vars, "--extra-env-var"),
                        };
                        if list.is_some() {
                            return Err(usage(format!(
                                "--unset {field} and {flag} together: {flag} alone replaces the list"
                            )));
                        }
                        *list = Some(Vec::new());
                        continue;
                    }
                    other => return Err(usage(format!("--unset: no optional field {other:?}"))),
                };
                *slot = Some(None);
            }
            let definition = client.update_environment(&name, &request).await?;
            if global.json {
                print_json(&definition);
            } else {
                println!("{} {}", definition.name, definition.id);
            }
        }
        EnvsCommand::Rm { name } => {
            client.delete_environment(&name).await?;
            if global.json {
                print_json(&json!({"deleted": name}));
            } else {
                println!("deleted {name}");
            }
        }
    }
    Ok(exit::OK)
}

fn parse_kind(kind: &str) -> Result<wuhu_core::wire::runner::EnvironmentKind> {
    serde_json::from_value(json!(kind)).map_err(|_| {
        usage(format!(
            "--kind must be local, folder-template or worktree, not {kind:?}"
        ))
    })
}

fn parse_approval(approval: &str) -> ApprovalPolicy {
    if approval == "ask" {
        ApprovalPolicy::Ask
    } else {
        ApprovalPolicy::Auto
    }
}

/// The approvals of `session_id` still waiting in `entries`, as `approvals list --json` prints
/// them (the rule is [`wuhu_core::approvals::pending_requests`]).
fn pending_approvals(session_id: &str, entries: &[Entry]) -> Vec<Value> {
    wuhu_core::approvals::pending_requests(entries)
        .into_iter()
        .map(|data| {
            json!({
                "sessionId": session_id,
                "approvalId": data["approvalId"],
                "tool": data["tool"],
                "environment": data["environment"],
                "runner": data["runner"],
                "approver": data["approver"],
                "requestedBy": data["requestedBy"],
                "expiresAt": data["expiresAt"],
                "text": data["text"],
            })
        })
        .collect()
}

async fn approvals(global: &Global, command: ApprovalsCommand) -> Result<u8> {
    let client = connect(global)?;
    let (session, approval, decision) = match command {
        ApprovalsCommand::List { session } => {
            let ids = match session {
                Some(id) => vec![id],
                // Only a running turn can wait for an approval.
                None => client
                    .list_sessions(Some(200), None)
                    .await?
                    .sessions
                    .into_iter()
                    .filter(|s| s.status == wuhu_core::wire::Status::Running)
                    .map(|s| s.id)
                    .collect(),
            };
            let mut all = Vec::new();
            for id in ids {
                let page = client.transcript(&id, 0).await?;
                all.extend(pending_approvals(&id, &page.transcript));
            }
            if global.json {
                print_json(&json!({"approvals": all}));
            } else if all.is_empty() {
                println!("no approvals waiting");
            } else {
                let rows = all.iter().map(|a| {
                    vec![
                        a["sessionId"].as_str().unwrap_or_default().to_string(),
                        a["approvalId"].as_str().unwrap_or_default().to_string(),
                        a["tool"].as_str().unwrap_or_default().to_string(),
                        a["approver"]["sub"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        summarize(
                            a["summary"]
                                .as_str()
                                .or(a["text"].as_str())
                                .unwrap_or_default(),
                            80,
                        ),
                    ]
                });
                table(&["SESSION", "APPROVAL", "TOOL", "APPROVER", "ASKS"], rows);
            }
            return Ok(exit::OK);
        }
        ApprovalsCommand::Approve {
            session,
            approval,
            for_session,
            always,
        } => (
            session,
            approval,
            match (for_session, always) {
                (true, _) => Answer::ApproveSession,
                (_, true) => Answer::Always,
                _ => Answer::Approve,
            },
        ),
        ApprovalsCommand::Deny { session, approval } => (session, approval, Answer::Deny),
    };
    let answer = client
        .answer_approval(&session, &approval, decision)
        .await?;
    if global.json {
        print_json(&answer);
    } else {
        println!("{}: {}", answer.approval_id, answer.decision.as_str());
    }
    Ok(exit::OK)
}

async fn docs(global: &Global, command: DocsCommand) -> Result<u8> {
    let client = connect(global)?;
    match command {
        DocsCommand::Ls { prefix } => {
            let mut docs = Vec::new();
            let mut cursor: Option<String> = None;
            loop {
                let page = client.list_docs(&prefix, None, cursor.as_deref()).await?;
                docs.extend(page.docs);
                match page.cursor {
                    Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                    _ => break,
                }
            }
            if global.json {
                print_json(&json!({"docs": docs}));
            } else {
                let rows = docs
                    .iter()
                    .map(|d| vec![d.path.clone(), d.size.to_string(), ago(d.updated)]);
                table(&["PATH", "BYTES", "UPDATED"], rows);
            }
        }
        DocsCommand::Get { path } => {
            let doc = client.doc(&path).await?;
            if global.json {
                print_json(&doc);
            } else {
                print!("{}", doc.content);
                if !doc.content.ends_with('\n') {
                    println!();
                }
            }
        }
        DocsCommand::Put { path, file } => {
            let content = match file.as_deref() {
                None | Some("-") => {
                    let mut text = String::new();
                    std::io::stdin()
                        .read_to_string(&mut text)
                        .context("cannot read the document from stdin")?;
                    text
                }
                Some(file) => std::fs::read_to_string(file)
                    .map_err(|e| usage(format!("cannot read {file}: {e}")))?,
            };
            let summary = client.put_doc(&path, &content).await?;
            if global.json {
                print_json(&summary);
            } else {
                println!("{} ({} bytes)", summary.path, summary.size);
            }
        }
        DocsCommand::Rm { path } => {
            client.delete_doc(&path).await?;
            if global.json {
                print_json(&json!({"deleted": path}));
            } else {
                println!("deleted {path}");
            }
        }
    }
    Ok(exit::OK)
}

async fn secrets(global: &Global, command: SecretsCommand) -> Result<u8> {
    let client = connect(global)?;
    let scope = |tenant: bool| {
        if tenant {
            SecretScope::Tenant
        } else {
            SecretScope::User
        }
    };
    match command {
        SecretsCommand::List => {
            let list = client.list_secrets().await?;
            if global.json {
                print_json(&list);
            } else {
                let rows = list.secrets.iter().map(|s| {
                    vec![
                        s.name.clone(),
                        s.scope.as_str().to_string(),
                        s.environments.join(","),
                        s.hosts.join(","),
                        format!("{} {}", s.set_by, ago(s.set_at)),
                    ]
                });
                table(&["NAME", "SCOPE", "ENVIRONMENTS", "HOSTS", "SET"], rows);
            }
        }
        SecretsCommand::Set {
            name,
            tenant,
            environments,
            hosts,
        } => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                eprint!(
                    "value of {name} (not echoed by your terminal only if you pipe it; end with Ctrl-D): "
                );
            }
            let mut value = String::new();
            stdin
                .lock()
                .read_to_string(&mut value)
                .context("cannot read the secret's value from stdin")?;
            // `echo "$TOKEN" | wuhu secrets set` ends with a newline nobody means.
            let value = value.strip_suffix('\n').unwrap_or(&value);
            let value = value.strip_suffix('\r').unwrap_or(value).to_string();
            if value.is_empty() {
                return Err(usage("the value (stdin) is empty"));
            }
            let body = PutSecretRequest {
                value,
                scope: scope(tenant),
                hosts,
                environments,
            };
            let info = client.put_secret(&name, &body).await?;
            if global.json {
                print_json(&info);
            } else {
                println!("set {} secret {}", info.scope.as_str(), info.name);
            }
        }
        SecretsCommand::Rm { name, tenant } => {
            client.delete_secret(&name, scope(tenant)).await?;
            if global.json {
                print_json(&json!({"deleted": name}));
            } else {
                println!("deleted {name}");
            }
        }
    }
    Ok(exit::OK)
}

async fn policy(global: &Global, command: PolicyCommand) -> Result<u8> {
    let client = connect(global)?;
    let PolicyCommand::Check {
        tool,
        command,
        path,
        host,
        environment,
        runner,
        runner_owner,
        mcp,
        cost_usd,
    } = command;
    let query = wuhu_core::policy::CheckQuery {
        tool,
        environment,
        runner,
        runner_owner,
        command,
        path,
        host,
        mcp,
        cost_usd,
    };
    let answer = client.check_policy(&query).await?;
    if global.json {
        print_json(&answer);
        return Ok(exit::OK);
    }
    match &answer.verdict {
        None => println!("allow (no rule matched; the usual approvals still apply)"),
        Some(v) => {
            let reason = v
                .reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            println!(
                "{} by {}{reason} (matched {:?})",
                v.decision.as_str(),
                v.rule.describe(),
                v.subject
            );
        }
    }
    if !answer.commands.is_empty() {
        println!("commands: {}", answer.commands.join(" | "));
    }
    if answer.opaque {
        println!("opaque: part of the command cannot be read before it runs, so no rule allows it");
    }
    Ok(exit::OK)
}

async fn mcp(global: &Global, command: McpCommand) -> Result<u8> {
    use wuhu_core::mcp_client::config::{ServerView, SourceKind};
    let client = connect(global)?;
    let whose = |s: &ServerView| match (&s.source, &s.user) {
        (SourceKind::User, Some(sub)) => format!("{sub}'s own"),
        _ => "tenant".to_string(),
    };
    match command {
        McpCommand::List => {
            let list = client.mcp_servers().await?;
            if global.json {
                print_json(&list);
                return Ok(exit::OK);
            }
            if list.servers.is_empty() {
                println!(
                    "no MCP servers (admins list the tenant's in config/mcp.json; yours go in users/<you>/mcp.json)"
                );
            } else {
                table(
                    &["NAME", "WHOSE", "URL", "AUTH", "APPROVAL"],
                    list.servers.iter().map(|s| {
                        vec![
                            s.name.clone(),
                            whose(s),
                            s.url.clone(),
                            match &s.secret {
                                Some(secret) => format!("bearer {secret}"),
                                None => "none".into(),
                            },
                            serde_json::to_value(s.approval)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default(),
                        ]
                    }),
                );
            }
            for s in &list.not_offered {
                println!(
                    "not offered: {} ({}), whose name a tenant server takes",
                    s.name,
                    whose(s)
                );
            }
            for e in &list.errors {
                eprintln!("wuhu: {e}");
            }
            Ok(if list.errors.is_empty() {
                exit::OK
            } else {
                exit::SERVER
            })
        }
        McpCommand::Tools { name } => {
            let list = client.mcp_tools(&name).await?;
            if global.json {
                print_json(&list);
                return Ok(exit::OK);
            }
            table(
                &["TOOL", "OFFERED", "DESCRIPTION"],
                list.tools.iter().map(|t| {
                    vec![
                        t.name.clone(),
                        if t.offered { "yes" } else { "no" }.into(),
                        t.description
                            .lines()
                            .next()
                            .unwrap_or("")
                            .chars()
                            .take(80)
                            .collect(),
                    ]
                }),
            );
            if list.truncated {
                println!("(the server lists more tools than were read)");
            }
            Ok(exit::OK)
        }
        McpCommand::Connect { name } => {
            let started = client.mcp_connect(&name).await?;
            if global.json {
                print_json(&started);
            } else {
                println!("Open this address in your browser within 10 minutes to connect {name}:");
                println!("{}", started.authorization_url);
            }
            Ok(exit::OK)
        }
        McpCommand::Disconnect { name } => {
            let done = client.mcp_disconnect(&name).await?;
            if global.json {
                print_json(&done);
            } else if done.disconnected {
                println!("disconnected {name}");
            } else {
                println!("{name} was not connected");
            }
            Ok(exit::OK)
        }
    }
}

fn usd(value: f64) -> String {
    format!("${value:.4}")
}

/// `total: N messages, … tokens, $X`, with the unpriced count and `more`.
fn print_total(total: &wuhu_core::llm::models::UsageTotals, more: &str) {
    let unpriced = if total.unpriced_messages > 0 {
        format!(" ({} unpriced)", total.unpriced_messages)
    } else {
        String::new()
    };
    println!(
        "total: {} messages, {} input and {} output tokens, {}{unpriced}{more}",
        total.messages,
        total.input_tokens,
        total.output_tokens,
        usd(total.cost_usd)
    );
}

fn print_session_usage(usage: &wuhu_core::wire::UsageResponse) {
    let u = &usage.usage;
    table(
        &[
            "PROVIDER",
            "MODEL",
            "MESSAGES",
            "INPUT",
            "OUTPUT",
            "CACHE READ",
            "COST",
        ],
        u.by_model.iter().map(|m| {
            vec![
                m.provider.clone(),
                m.model.clone(),
                m.totals.messages.to_string(),
                m.totals.input_tokens.to_string(),
                m.totals.output_tokens.to_string(),
                m.totals.cache_read_tokens.to_string(),
                usd(m.totals.cost_usd),
            ]
        }),
    );
    print_total(&u.total, "");
    println!(
        "policy: {} allowed, {} asked, {} denied; MCP: {} calls, {} failed",
        u.policy.allowed, u.policy.asked, u.policy.denied, u.mcp.calls, u.mcp.errors
    );
    if let Some(budget) = &usage.budget {
        println!(
            "budget: {} tokens, {}; spent {} tokens, {}",
            budget
                .max_tokens
                .map_or("no limit on".into(), |t| t.to_string()),
            budget.max_usd.map_or("no dollar limit".into(), usd),
            usage.spent.tokens,
            usd(usage.spent.usd)
        );
    }
}

/// `wuhu channels`.
pub async fn channels(global: &Global, command: ChannelsCommand) -> Result<u8> {
    let client = connect(global)?;
    match command {
        ChannelsCommand::List => {
            let listed = client.list_channels().await?;
            if global.json {
                print_json(&listed);
            } else if listed.channels.is_empty() {
                println!("no channel bindings");
            } else {
                table(
                    &["ID", "PLATFORM", "NAME", "ADMIT", "WEBHOOK"],
                    listed.channels.iter().map(|c| {
                        let view = serde_json::to_value(c).unwrap_or_default();
                        vec![
                            view["id"].as_str().unwrap_or_default().to_string(),
                            view["platform"].as_str().unwrap_or_default().to_string(),
                            view["name"].as_str().unwrap_or_default().to_string(),
                            view["admit"].as_str().unwrap_or_default().to_string(),
                            c.webhook_url.clone(),
                        ]
                    }),
                );
            }
        }
        ChannelsCommand::Show { id } => {
            let view = client.channel(&id).await?;
            print_channel(global, &view);
        }
        ChannelsCommand::Add => {
            if std::io::stdin().is_terminal() {
                eprintln!("Paste the binding's JSON (docs/api.md, \"Channels\"), then Ctrl-D:");
            }
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("cannot read the binding from stdin")?;
            let body: Value = serde_json::from_str(&text)
                .map_err(|e| usage(format!("the binding on stdin is not JSON: {e}")))?;
            let view = client.create_channel(&body).await?;
            print_channel(global, &view);
        }
        ChannelsCommand::Rm { id } => {
            client.delete_channel(&id).await?;
            if global.json {
                print_json(&json!({"deleted": id}));
            } else {
                println!("deleted channel binding {id}");
            }
        }
        ChannelsCommand::Members { id, map, clear } => {
            let members = if clear || !map.is_empty() {
                let mut members = Vec::new();
                for pair in &map {
                    let (user, sub) = pair
                        .split_once('=')
                        .ok_or_else(|| usage(format!("--map {pair:?}: expected USER=SUB")))?;
                    members.push(wuhu_core::channels::members::Member {
                        user: user.to_string(),
                        sub: sub.to_string(),
                    });
                }
                let body = wuhu_core::channels::members::Members { members };
                client.set_channel_members(&id, &body).await?
            } else {
                client.channel_members(&id).await?
            };
            if global.json {
                print_json(&members);
            } else if members.members.is_empty() {
                println!("nobody is mapped: everyone in the thread is a guest");
            } else {
                table(
                    &["USER", "SUB"],
                    members
                        .members
                        .iter()
                        .map(|m| vec![m.user.clone(), m.sub.clone()]),
                );
            }
        }
    }
    Ok(exit::OK)
}

fn print_channel(global: &Global, view: &wuhu_core::channels::ChannelView) {
    if global.json {
        print_json(view);
        return;
    }
    let value = serde_json::to_value(view).unwrap_or_default();
    println!(
        "{} {} {:?} (admit: {})",
        value["id"].as_str().unwrap_or_default(),
        value["platform"].as_str().unwrap_or_default(),
        value["name"].as_str().unwrap_or_default(),
        value["admit"].as_str().unwrap_or_default()
    );
    println!("webhook: {}", view.webhook_url);
    for (field, masked) in &view.credentials {
        println!("  {field}: {}", masked.as_str().unwrap_or_default());
    }
    for (n, step) in view.setup.iter().enumerate() {
        println!("{}. {step}", n + 1);
    }
}

/// `wuhu jobs`.
pub async fn jobs(global: &Global, args: JobsArgs) -> Result<u8> {
    let client = connect(global)?;
    let listed = client.session_jobs(&args.session).await?;
    if global.json {
        print_json(&listed);
        return Ok(exit::OK);
    }
    if listed.jobs.is_empty() {
        println!("no background jobs");
        return Ok(exit::OK);
    }
    table(
        &["JOB", "STATE", "EXIT", "ENVIRONMENT", "RUNNER", "COMMAND"],
        listed.jobs.iter().map(|j| {
            let exit = match &j.report {
                Some(r) if r.timed_out => "timeout".to_string(),
                Some(r) => r
                    .exit_code
                    .map(|c| c.to_string())
                    .or(r.signal.map(|s| format!("signal {s}")))
                    .unwrap_or_default(),
                None => String::new(),
            };
            vec![
                j.job_id.clone(),
                j.state.as_str().to_string(),
                exit,
                j.environment.clone(),
                format!("{}/{}", j.runner_owner, j.runner),
                j.command.clone(),
            ]
        }),
    );
    for job in &listed.jobs {
        if let Some(reason) = &job.reason {
            println!("{}: {reason}", job.job_id);
        }
        if args.output
            && let Some(report) = &job.report
            && !report.output_tail.is_empty()
        {
            println!(
                "--- {} ({} lines in all) ---",
                job.job_id, report.total_lines
            );
            println!("{}", report.output_tail.trim_end());
        }
    }
    Ok(exit::OK)
}

/// `wuhu usage`.
pub async fn tenant_usage(global: &Global, args: UsageArgs) -> Result<u8> {
    let client = connect(global)?;
    let usage = client
        .tenant_usage(Some(&args.by), args.from, args.to)
        .await?;
    if global.json {
        print_json(&usage);
        return Ok(exit::OK);
    }
    table(
        &["KEY", "MESSAGES", "INPUT", "OUTPUT", "COST"],
        usage.groups.iter().map(|g| {
            let key = match &g.provider {
                Some(provider) => format!("{provider}/{}", g.key),
                None => g.key.clone(),
            };
            vec![
                key,
                g.totals.messages.to_string(),
                g.totals.input_tokens.to_string(),
                g.totals.output_tokens.to_string(),
                usd(g.totals.cost_usd),
            ]
        }),
    );
    print_total(
        &usage.total,
        if usage.truncated {
            " (more groups than shown)"
        } else {
            ""
        },
    );
    if usage.mcp.calls > 0 || usage.mcp.errors > 0 {
        let servers: Vec<String> = usage
            .mcp
            .by_server
            .iter()
            .map(|s| format!("{} {}", s.server, s.calls))
            .collect();
        println!(
            "MCP: {} calls, {} failed ({})",
            usage.mcp.calls,
            usage.mcp.errors,
            servers.join(", ")
        );
    }
    Ok(exit::OK)
}

/// `wuhu budget`.
pub async fn budget(global: &Global, args: BudgetArgs) -> Result<u8> {
    let client = connect(global)?;
    let answer = if args.clear || args.max_tokens.is_some() || args.max_usd.is_some() {
        let budget = wuhu_core::wire::Budget {
            max_tokens: args.max_tokens,
            max_usd: args.max_usd,
        };
        client.set_budget(&budget).await?
    } else {
        client.budget().await?
    };
    if global.json {
        print_json(&answer);
        return Ok(exit::OK);
    }
    match &answer.budget {
        None => println!("no budget"),
        Some(b) => println!(
            "budget: {}, {}",
            b.max_tokens
                .map_or("no token limit".into(), |t| format!("{t} tokens")),
            b.max_usd.map_or("no dollar limit".into(), usd)
        ),
    }
    println!(
        "spent: {} tokens, {}",
        answer.spent.tokens,
        usd(answer.spent.usd)
    );
    Ok(exit::OK)
}

/// Prints pretty JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) {
    match serde_json::to_string_pretty(value) {
        Ok(text) => println!("{text}"),
        Err(e) => eprintln!("wuhu: error: cannot encode output: {e}"),
    }
}

/// Prints rows under headers, columns padded (the last one is not).
fn table(headers: &[&str], rows: impl Iterator<Item = Vec<String>>) {
    let rows: Vec<Vec<String>> = rows.collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let n = cells.len();
        let mut text = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            if i + 1 == n {
                text.push_str(&cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                text.push_str(&cell);
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        text.trim_end().to_string()
    };
    println!("{}", line(headers.iter().map(|h| h.to_string()).collect()));
    for row in rows {
        println!("{}", line(row));
    }
}

/// Unix seconds now.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `5m ago`-style text for a unix time.
fn ago(unix: i64) -> String {
    let seconds = unix_now() - unix;
    if seconds < 0 {
        return "just now".into();
    }
    format!("{} ago", duration_text(seconds))
}

/// `42s`, `5m`, `3h`, `2d`.
fn duration_text(seconds: i64) -> String {
    match seconds {
        s if s < 0 => "expired".into(),
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
