//! `wuhu`: the command-line client of a Wuhu server (`docs/cli.md`).
//!
//! Every command talks to the server's HTTP API v1 through [`wuhu_client`]; nothing here
//! calls an LLM or touches server storage (seed 001: the client is thin). `--json` prints
//! machine-readable output on stdout; errors go to stderr and set the exit code:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | usage: bad arguments, or the server refused the request as malformed (400, 413) |
//! | 2 | authentication: no token, or the server answered 401 / 403 |
//! | 3 | not found (404) |
//! | 4 | server or network: 5xx, 409, 429, unreachable, the stream gave up |

mod chat;
mod commands;
mod config;
mod render;
mod token;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Exit codes (module docs).
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// Usage error.
    pub const USAGE: u8 = 1;
    /// Authentication or permission.
    pub const AUTH: u8 = 2;
    /// Not found.
    pub const NOT_FOUND: u8 = 3;
    /// Server or network.
    pub const SERVER: u8 = 4;
}

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "wuhu",
    version,
    about = "Talk to a Wuhu server: sessions, chat, environments, runners, approvals, docs",
    after_help = "Server and token: --server/--token, else WUHU_SERVER/WUHU_TOKEN, else the profile \
in ~/.wuhu/client.yml (WUHU_CONFIG overrides the path), else http://127.0.0.1:8787.\n\
Exit codes: 0 ok, 1 usage, 2 auth, 3 not found, 4 server or network."
)]
pub struct Cli {
    /// Options every command takes.
    #[command(flatten)]
    pub global: Global,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Args, Debug, Clone)]
pub struct Global {
    /// Server base URL (overrides WUHU_SERVER and the profile).
    #[arg(long, global = true)]
    pub server: Option<String>,
    /// Bearer token (overrides WUHU_TOKEN and the profile).
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// Profile in the config file (default: WUHU_PROFILE, else the file's `current`, else `default`).
    #[arg(long, global = true)]
    pub profile: Option<String>,
    /// Machine-readable JSON on stdout.
    #[arg(long, global = true)]
    pub json: bool,
}

/// Top-level commands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Save a server and token as a profile: `wuhu login --server URL [--token T]` (without
    /// --token the token is read from stdin: paste it). With `--mint NAME` the given token is
    /// used once to mint a named, revocable token (`POST /v1/tokens`), which is saved instead.
    Login {
        /// Save without checking the token with the server.
        #[arg(long, conflicts_with = "mint")]
        no_verify: bool,
        /// Mint a new user token with this name through the server and save that one.
        #[arg(long, value_name = "NAME")]
        mint: Option<String>,
        /// Lifetime of the minted token in whole days (server default 30).
        #[arg(long, requires = "mint")]
        ttl_days: Option<i64>,
    },
    /// Remove the token from a profile.
    Logout,
    /// Who the token says you are, and whether the server accepts it.
    Whoami,
    /// Chat with a session in the terminal (a new one when SESSION is absent).
    Chat(chat::ChatArgs),
    /// Sessions: list, create, show, follow, send, stop, cancel, rename, rm.
    #[command(subcommand)]
    Sessions(commands::SessionsCommand),
    /// Environment definitions.
    #[command(subcommand)]
    Envs(commands::EnvsCommand),
    /// Connected and known runners.
    #[command(subcommand)]
    Runners(commands::RunnersCommand),
    /// Approvals waiting for an answer.
    #[command(subcommand)]
    Approvals(commands::ApprovalsCommand),
    /// The tenant's workspace documents.
    #[command(subcommand)]
    Docs(commands::DocsCommand),
    /// Tokens: mint with the secret (operators), list and revoke registered ones.
    #[command(subcommand)]
    Token(commands::TokenCommand),
    /// Secrets that environments' commands get by name: set (value from stdin), list, rm.
    #[command(subcommand)]
    Secrets(commands::SecretsCommand),
    /// The policy engine: what the tenant's rules (and a runner owner's) would decide on a call.
    #[command(subcommand)]
    Policy(commands::PolicyCommand),
    /// What the tenant's sessions used, grouped by model, session, user or day (a member's own).
    Usage(commands::UsageArgs),
    /// A session's background jobs: command, where, state, exit, and the tail of the output.
    Jobs(commands::JobsArgs),
    /// Chat platform bindings and their member mapping (admins): list, show, add (the binding's
    /// JSON on stdin), rm, members.
    #[command(subcommand)]
    Channels(commands::ChannelsCommand),
    /// The tenant's budget and what it spent; `--max-tokens`/`--max-usd`/`--clear` set it
    /// (admins).
    Budget(commands::BudgetArgs),
    /// MCP servers sessions may use (`config/mcp.json`, `users/<you>/mcp.json`): list, tools.
    #[command(subcommand)]
    Mcp(commands::McpCommand),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = match error.kind() {
                clap::error::ErrorKind::DisplayHelp
                | clap::error::ErrorKind::DisplayVersion
                | clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => exit::OK,
                _ => exit::USAGE,
            };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("wuhu: error: cannot start the runtime: {error}");
            return ExitCode::from(exit::SERVER);
        }
    };
    let json = cli.global.json;
    let outcome = runtime.block_on(commands::run(cli));
    // Stdin is read on a blocking thread that may still wait for a line: do not wait for it.
    runtime.shutdown_background();
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            let (code, text) = commands::describe_error(&error);
            if json {
                eprintln!("{text}");
            } else {
                eprintln!("wuhu: error: {text}");
            }
            ExitCode::from(code)
        }
    }
}
